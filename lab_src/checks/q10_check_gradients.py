"""Visible check of q10 (check_gradients): the student's check on true gradients, a disturbed baseline and a
missing gradient."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("q10", [VISIBLE], ["check_gradients"])
