"""Visible check of q12 (one_f_one_b_step): the step on 4 stages with 8 micro-batches (a steady state of
several rounds) and on 3 uneven stages with 2, compared with the baseline, checked to be a real pipeline,
and judged by One-Forward-One-Backward's rules; the memory each rank held is printed beside the run.
The notebook's experiments (memory and bubble against m, 1000 micro-batches) are in experiments.py."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("q12", [VISIBLE.replace(num_microbatches=8, global_batch_size=16),
                                  VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)], [])
