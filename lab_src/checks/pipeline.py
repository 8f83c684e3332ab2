"""What the visible checks of q08, q09 and q10 share: a pipelined step on the visible configurations,
compared with the unsharded baseline and checked to be a real pipeline of the exercise's schedule."""
from __future__ import annotations

from lab_src.checks.common import (UNFINISHED, CheckReport, LabConfig, errors, exercise, finish, indent, make_case,
                                   run_cases, run_dir, sources)
from lab_src.judge.probes import judge_check_gradients, judge_check_outputs
from lab_src.judge.realness import check_run
from lab_src.views import bubble, grid


def pipeline_check(qid: str, configs: list[LabConfig], probes: list[str]) -> CheckReport:
    """Run the step of `qid`'s schedule on `configs` and judge it as the hidden tests do."""
    from lab_src.answers import use_answers
    from lab_src.harness.groups import device_for
    from lab_src.judge.compare import compare_run
    from lab_src.pipeline.baseline import compute_baseline, load_baseline, save_baseline
    ex = exercise(qid)
    srcs = sources(qid)
    folder = run_dir(qid)
    cases = []
    with use_answers(srcs):
        for cfg in configs:
            base = compute_baseline(cfg, device_for(cfg.num_stages))
            path = save_baseline(base, folder.resolve() / f"baseline-{cfg.key()}.pt")
            cases.append(make_case("pipeline", cfg, srcs, qid, baseline=str(path), probes=probes,
                                   schedule=ex.schedule_of_step, step=ex.step_exercise))
    run = run_cases(cases, folder)
    problems, lines = [], [f"{qid} {exercise(qid).function}"]
    for cfg, out, case in zip(configs, run.outcomes, cases):
        label = cfg.describe()
        lines.append(f"\n  {label}:")
        errs = errors(out, qid, label)
        problems += errs
        if errs:
            lines.append(UNFINISHED)
            continue
        numbers = compare_run(out, load_baseline(case.baseline), qid, label)
        found = numbers + check_run(out, qid, label)
        if "check_outputs" in probes:
            found += judge_check_outputs(out, qid, label)
        if "check_gradients" in probes:
            found += judge_check_gradients(out, qid, label)
        problems += found
        lines.append("    outputs, loss and every stage's gradients " +
                     ("DIFFER from the unsharded baseline (see below)" if numbers else "match the unsharded baseline")
                     + (", but see the problems below" if found and not numbers else ""))
        events = out.events()
        lines.append(indent(grid.time_grid(events, cfg.num_stages)))
        lines.append("    " + bubble.describe(events, cfg.num_stages, cfg.num_microbatches))
    return finish(qid, run, problems, lines)
