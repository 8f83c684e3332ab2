"""Visible check of q08 (afab_step): the step on 4 stages with 4 micro-batches and on 3 uneven stages with 2."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("q08", [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)], [])
