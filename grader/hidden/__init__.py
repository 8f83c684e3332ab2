"""The hidden tests, one module per exercise: grader/hidden/qNN_<function>.py (the registry's module name).

Each module defines
    cases(ctx)           the check cases to run (harness.case.Case): the graded exercise uses the student's
                         answer, every other exercise the reference, so one mistake costs points once;
    judge(ctx, outcomes) the items that passed or failed, grouped in parts (common.Item).
"""
from __future__ import annotations

import importlib

from lab_src.registry import CODED, exercise


def hidden_tests(qid: str):
    """The hidden-test module of `qid`; a coded exercise without one is an error, never a silent zero."""
    ex = exercise(qid)
    try:
        module = importlib.import_module(f"grader.hidden.{ex.module}")
    except ModuleNotFoundError as e:
        if e.name != f"grader.hidden.{ex.module}":
            raise
        raise RuntimeError(f"{ex.id} has no hidden tests: grader/hidden/{ex.module}.py is missing") from None
    for name in ("cases", "judge"):
        if not callable(getattr(module, name, None)):
            raise RuntimeError(f"grader/hidden/{ex.module}.py must define {name}()")
    return module


def all_hidden_tests() -> dict:
    return {ex.id: hidden_tests(ex.id) for ex in CODED}
