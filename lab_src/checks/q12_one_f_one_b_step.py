"""Visible check of q12 (one_f_one_b_step): the step on 4 stages with 8 micro-batches (a steady state of
several rounds) and on 3 uneven stages with 2, compared with the baseline, checked to be a real pipeline,
and judged by One-Forward-One-Backward's rules; the memory each rank held is printed beside the run.
Last, whether the prediction of each rank's warm-up (predicted_warmup()) matches 1F1B's, without the counts.
The notebook's experiments (memory and bubble against m, 1000 micro-batches) are in experiments.py."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("q12", [VISIBLE.replace(num_microbatches=8, global_batch_size=16),
                                  VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)], [],
                          after=lambda srcs: prediction_line(srcs.get("q12")))


def prediction_line(path: str | None) -> str:
    """Whether the student's predicted_warmup() matches 1F1B's warm-ups (for which m it differs, not the
    right counts: the grader grades them)."""
    from pathlib import Path

    from lab_src.judge.numeric import NotANumber, read_numbers
    from lab_src.judge.one_f_one_b import PREDICTION_MICROBATCHES, PREDICTION_NAME, PREDICTION_STAGES, prediction_problems
    ms = " and ".join(f"m = {m}" for m in PREDICTION_MICROBATCHES)
    head = f"your prediction ({PREDICTION_NAME}, p = {PREDICTION_STAGES}, {ms}): "
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME) if path else {}
    except NotANumber as e:
        return head + f"not read ({e}); it is graded"
    wrong = prediction_problems(got)
    if not wrong:
        return head + "matches 1F1B's warm-ups (graded)"
    return head + "differs from 1F1B (graded): " + "; ".join(p.message.replace(f"{PREDICTION_NAME}() says ", "")
                                                             for p in wrong)
