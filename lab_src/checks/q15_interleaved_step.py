"""Visible check of q15 (interleaved_step): TODO say what it runs."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport, errors, finish, make_case, run_cases, run_dir, sources


def check() -> CheckReport:
    srcs = sources("q15")
    problems, lines = [], ["q15 interleaved_step"]
    run = run_cases([make_case("units", VISIBLE, srcs, "q15", calls=[])], run_dir("q15"))
    problems += errors(run.outcomes[0], "q15", VISIBLE.describe())
    return finish("q15", run, problems, lines)
