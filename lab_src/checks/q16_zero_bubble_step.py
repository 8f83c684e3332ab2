"""Visible check of q16 (zero_bubble_step, backward_input, backward_weight), in one launch:
- the split on its own, on one rank: each stage of a 3-stage float64 model, the two halves against one
  backward() (gradients to 1e-12, added to what .grad held; the floating-point work of one backward, not a
  second pass; nothing held after W: lab_src/topics/zero_bubble/judge.py);
- the step on 4 stages with 4 micro-batches and on 3 uneven stages with 2, compared with the unsharded
  baseline, checked to be a real pipeline and judged against ZB-H1's rules ("zbh1" in
  lab_src/pipeline/schedules.py), with the time grid of F, I and W boxes, the bubble and the memory held.
The split runs first: it sends no message and cannot deadlock, and a launch skips the cases of an exercise
after two of them deadlocked or timed out, so behind a step that does (a W before its I) it would not run,
and a report would not say that the split is right. A failed report says first what passed."""
from __future__ import annotations

import dataclasses

from lab_src.checks.common import (UNFINISHED, VISIBLE, CheckReport, errors, exercise, finish, indent, make_case,
                                   run_cases, run_dir, sources)
from lab_src.checks.step_check import causes_then_numbers, memory_line, why_above
from lab_src.topics.zero_bubble import judge as split
from lab_src.judge.problems import stamped
from lab_src.judge.realness import check_run
from lab_src.views import bubble, text_grid

QID = "q16"
CHECKED = [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)]
SPLIT = VISIBLE.replace(num_stages=3, num_layers=4, num_microbatches=1, global_batch_size=2, dtype="float64")
SPLIT_LABEL = "the split alone, each stage of 3, float64"


def zero_bubble_line(events, cfg) -> str:
    """'; ZB-H1 with your boxes (T_F 1.2 ms, T_B 0.9 ms, T_W 1.1 ms): 13.0%': its theory from the run's own boxes."""
    times = bubble.split_box_times(events)
    if times is None:
        return ""
    t_f, t_b, t_w = times
    theory = bubble.zero_bubble_theory(cfg.num_stages, cfg.num_microbatches, t_f, t_b, t_w)
    return (f"; ZB-H1's (p-1)(T_F+T_B-T_W)/step with your boxes (T_F {t_f * 1e3:.1f} ms, T_B {t_b * 1e3:.1f} ms, "
            f"T_W {t_w * 1e3:.1f} ms) = {theory:.1%}")


def check() -> CheckReport:
    from lab_src.harness.baselines import baselines_for
    from lab_src.judge.compare import compare_run
    srcs = sources(QID)
    folder = run_dir(QID)
    baselines = baselines_for(CHECKED, srcs, folder)
    cases = [make_case("split", SPLIT, srcs, QID, stages=1, label=SPLIT_LABEL)] + \
        [make_case("pipeline", cfg, srcs, QID) for cfg in CHECKED]
    run = run_cases(cases, folder)
    alone, *steps = run.outcomes
    run = dataclasses.replace(run, outcomes=[*steps, alone])    # the report's case 0: the 4-stage step (timeline())
    problems, lines, passed = [], [f"{QID} {exercise(QID).function}"], []
    lines.append(f"\n  {SPLIT_LABEL}:")
    errs = errors(alone, QID, SPLIT_LABEL)
    obs = alone.obs.get(0, {})
    found = errs or stamped(split.numbers(obs, SPLIT.dtype) + split.once(obs) + split.freed(obs), QID, SPLIT_LABEL)
    problems += found
    lines += [UNFINISHED] if errs else split.summary(obs)
    if not found:
        passed.append(f"{SPLIT_LABEL}: backward_input and backward_weight give one backward()'s gradients, do its "
                      f"work once and leave nothing held after W")
    for cfg, out in zip(CHECKED, steps):
        label = cfg.describe()
        lines.append(f"\n  {label}:")
        errs = errors(out, QID, label)
        problems += errs
        if errs:
            lines.append(UNFINISHED)
            continue
        numbers = compare_run(out, baselines[cfg])
        found = causes_then_numbers(QID, out, check_run(out), numbers)
        problems += stamped(found, QID, label)
        if not found:
            passed.append(f"{label}: the step is a real pipeline, matches the unsharded baseline and keeps "
                          "ZB-H1's rules")
        lines.append("    outputs, loss and every stage's gradients " +
                     ("DIFFER from the unsharded baseline (see below)" if numbers else "match the unsharded baseline")
                     + (", but see the problems below" if found and not numbers else ""))
        events = out.events()
        lines.append(indent(text_grid.time_grid(events, cfg.num_stages)))
        lines.append("    " + bubble.describe(events, cfg.num_stages, cfg.num_microbatches) + zero_bubble_line(events, cfg)
                     + why_above(events, cfg, QID))
        lines.append("    " + memory_line(events, cfg.num_stages))
    return finish(QID, run, problems, lines, passed=passed)
