"""The visible checks: what a student runs at the end of each notebook, one module per exercise.

    from lab_src.checks import check
    report = check("q08")          # launches torchrun, compares with the baseline, prints what happened
    report.timeline()              # the animated P2P timeline of the run (of the failing one, if any)
    report.ok, report.problems     # passed?, and what went wrong, causes first
    report.traceback               # the full tracebacks behind the messages, for the curious

`check("qNN")` runs `lab_src/checks/qNN_<function>.py`. These checks know the rules every correct
answer obeys, not the answers themselves; the grader's hidden tests (grader/hidden/) compare with the
reference answers on more configurations.
"""
from __future__ import annotations

import importlib

from lab_src.checks.common import CheckFailed, CheckReport, autograding, autograding_report, failed_in_notebook
from lab_src.grading import record_check
from lab_src.registry import exercise


def check(qid: str) -> CheckReport:
    """Run the visible check of exercise `qid` ("q02", ...). It returns its report whether it passed
    or not; `report.raise_if_failed()` raises `CheckFailed` for scripts that want an exception."""
    ex = exercise(qid)
    if autograding():
        return autograding_report(ex.id)
    if not ex.function:
        raise ValueError(f"{ex.id} has no check: its answers are written ones")
    module = importlib.import_module(f"lab_src.checks.{ex.module}")
    try:
        report = module.check()
    except BaseException as e:   # an interrupt too: Validate stops a cell that overruns its Execute.timeout
        # a missing or raising answer becomes the report's message; anything else surfaces as it is
        report = failed_in_notebook(ex.id, e) if isinstance(e, Exception) else None
        if report is None:
            record_check(ex.id, e)     # the test cell's Validate reads it (lab_src.grading.require_check)
            raise
    # a failed check returns its report: the test cell's Validate fails all the same, with its verdict
    record_check(ex.id, None if report.ok else CheckFailed("\n".join(report.verdict())))
    return report


def demo_seeds(num_ranks: int = 4) -> CheckReport:
    """Q1's experiment: what a seed does to the weights drawn on different ranks."""
    from lab_src.checks.q01_seeds import demo_seeds as demo
    return demo(num_ranks)


__all__ = ["check", "demo_seeds", "CheckReport", "CheckFailed"]
