"""Visible check of q09 (check_outputs): the student's check on true outputs, and on disturbed ones."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("q09", [VISIBLE], ["check_outputs"])
