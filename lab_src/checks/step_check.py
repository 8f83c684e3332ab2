"""What the visible checks of q08, q09, q10 and q12 share: a pipelined step on the visible configurations,
compared with the unsharded baseline and checked to be a real pipeline of the exercise's schedule."""
from __future__ import annotations

from dataclasses import replace

from lab_src.checks.common import (UNFINISHED, CheckReport, LabConfig, errors, exercise, finish, indent, make_case,
                                   run_cases, run_dir, sources)
from lab_src.judge.probes import judge_check_gradients, judge_check_outputs
from lab_src.judge.problems import Problem, stamped
from lab_src.judge.realness import check_run
from lab_src.pipeline.schedules import in_flight
from lab_src.views import bubble, text_grid
from lab_src.views.memory import describe_peaks


def pipeline_check(qid: str, configs: list[LabConfig], probes: list[str], after=None) -> CheckReport:
    """Run the step of `qid`'s schedule on `configs` and judge it as the hidden tests do; `after(srcs)`, if
    given, is a last line (q12's prediction, read from the answer file)."""
    from lab_src.harness.baselines import baselines_for
    from lab_src.judge.compare import compare_run
    srcs = sources(qid)
    folder = run_dir(qid)
    baselines = baselines_for(configs, srcs, folder)
    cases = [make_case("pipeline", cfg, srcs, qid, probes=probes, baseline=baselines.for_case(cfg, probes))
             for cfg in configs]
    run = run_cases(cases, folder)
    problems, lines = [], [f"{qid} {exercise(qid).function}"]
    for cfg, out in zip(configs, run.outcomes):
        label = cfg.describe()
        lines.append(f"\n  {label}:")
        errs = errors(out, qid, label)
        problems += errs
        if errs:
            lines.append(UNFINISHED)
            continue
        numbers = compare_run(out, baselines[cfg])
        found = causes_then_numbers(qid, out, check_run(out), numbers)
        if "check_outputs" in probes:
            found += judge_check_outputs(out)
        if "check_gradients" in probes:
            found += judge_check_gradients(out)
        problems += stamped(found, qid, label)
        lines.append("    outputs, loss and every stage's gradients " +
                     ("DIFFER from the unsharded baseline (see below)" if numbers else "match the unsharded baseline")
                     + (", but see the problems below" if found and not numbers else ""))
        events = out.events()
        lines.append(indent(text_grid.time_grid(events, cfg.num_stages)))
        lines.append("    " + bubble.describe(events, cfg.num_stages, cfg.num_microbatches) + why_above(events, cfg, qid))
        lines.append("    " + memory_line(events, cfg.num_stages))
    if after is not None:
        lines.append("\n  " + after(srcs))
    return finish(qid, run, problems, lines)


def causes_then_numbers(qid: str, out, rules: list[Problem], numbers: list[Problem]) -> list[Problem]:
    """The schedule's rules a run broke (for 1F1B, said in its own terms: warm-up, steady state, cool-down)
    before the numbers that differ: a step that pairs the wrong micro-batches breaks the order, and the
    gradients that differ follow from it (said after it, as what it caused)."""
    if not rules:
        return numbers
    if exercise(qid).schedule_of_step == "1f1b":
        from lab_src.judge.one_f_one_b import diagnose
        rules = diagnose(out.events(), out.case.stages, out.case.microbatches) + rules
    return rules + [replace(p, consequence=True) for p in numbers]


def memory_line(events, p: int) -> str:
    """'held for backward at most: rank 0 4 micro-batches (0.6 MiB), ...' from a run's events."""
    held = ", ".join(f"{max(in_flight(events, r), default=0)}" for r in range(p))
    return f"micro-batches held awaiting backward, at most: {held} (ranks 0..{p - 1}); peak activation " \
           f"memory: {describe_peaks(events, p)}"


def why_above(events, cfg, qid: str = "") -> str:
    """A word on a measured bubble far above (p-1)/(m+p-1): on the checks' tiny model a message costs about
    what a layer's compute does, and the formula counts compute only."""
    measured = bubble.measured_bubble(events, cfg.num_stages)
    theory = bubble.theoretical_bubble(cfg.num_stages, cfg.num_microbatches)
    if measured is None or measured < theory + 0.15:
        return ""
    return ("\n    (far above the formula, which assumes messages cost nothing: on this small model a message "
            "between two processes takes about as long as a layer's compute, so the ranks also wait on messages. "
            + ("The bubble study below measures it on a model where compute dominates.)" if qid in ("q12", "q15", "q16") else
               "Q12's bubble study measures it on a model where compute dominates.)"))
