"""Visible check of q13 (train_pipeline): TODO say what it runs."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport, errors, finish, make_case, run_cases, run_dir, sources


def check() -> CheckReport:
    srcs = sources("q13")
    problems, lines = [], ["q13 train_pipeline"]
    run = run_cases([make_case("units", VISIBLE, srcs, "q13", calls=[])], run_dir("q13"))
    problems += errors(run.outcomes[0], "q13", VISIBLE.describe())
    return finish("q13", run, problems, lines)
