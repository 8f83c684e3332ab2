"""`python -m grader new qNN function_name`: the skeleton of a new exercise, in every place it needs one.

Writes (never overwriting an existing file):
    solutions/pipeline_lab/qNN_<function>.ipynb and its .py twin   prose, answer cell, check, hidden-test cell
    lab_src/checks/qNN_<function>.py                               the visible check
    grader/hidden/qNN_<function>.py                                the hidden tests
and adds the exercise's declaration to lab_src/registry.py and its contract to lab_src/exercises.py.
What is left by hand: the prose, the reference answer, the check, the hidden tests, the cohort's
realistic mistakes (grader/cohort/answers/, handed in by students of grader/cohort/students.py). Everything
else (API, README table, zip-collect pattern, pytest marker, Slurm test totals) follows from the registry.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jupytext

from lab_src.registry import ASSIGNMENT, EXERCISES

from . import ROOT, SOURCE
from .notebook_text import as_text


def _cell(kind: str, source: str, **nbgrader) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    if nbgrader:
        cell["metadata"]["nbgrader"] = {"schema_version": 3, "task": False, "locked": not nbgrader.get("solution"),
                                        "solution": False, "grade": False, **nbgrader}
    return cell


def hidden_cell_source(qid: str, points: int) -> str:
    """The test cell: in the release, it fails nbgrader's Validate unless the check passed
    (lab_src.grading.require_check); the hidden part, which only the grader runs, stays out of the release."""
    return (f"# Hidden tests of {qid} ({points} points): the grader runs them in fresh processes, outside\n"
            f"# this notebook, and writes the score into the gradebook.\n"
            f"# Validate fails here unless the check above passed.\n"
            f"from lab_src.grading import require_check\n"
            f'require_check("{qid}")\n'
            f"### BEGIN HIDDEN TESTS\nfrom lab_src.grading import scored_out_of_process\n"
            f'scored_out_of_process("{qid}")\n### END HIDDEN TESTS')


def notebook(qid: str, function: str, title: str, points: int) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}, "lab": {"exercise": qid}},
            "cells": [{**cell, "id": f"{qid}-{i}"} for i, cell in enumerate([
                _cell("markdown", f"# {qid.upper()} · {title}\n\n*Exercise {qid} of the pipeline-parallelism lab · "
                                  f"{points} points*\n\nTODO: what this step of pipeline parallelism is, and why."),
                _cell("code", "%load_ext lab_src\nfrom lab_src.checks import check"),
                _cell("markdown", f"## Your task\n\nTODO: the contract of `{function}` (see lab_src/exercises.py)."),
                _cell("code", f"%%answer {qid}\ndef {function}():\n    ### BEGIN SOLUTION\n    raise NotImplementedError()"
                              f"\n    ### END SOLUTION", grade_id=f"{qid}_answer", solution=True),
                _cell("markdown", "## Check\n\nTODO: what the check runs and what it shows."),
                _cell("code", f'report = check("{qid}")'),
                _cell("code", hidden_cell_source(qid, points), grade_id=f"{qid}_hidden", grade=True, points=points),
            ])]}


VISIBLE_CHECK = '''"""Visible check of {qid} ({function}): TODO say what it runs."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport, errors, finish, make_case, run_cases, run_dir, sources


def check() -> CheckReport:
    srcs = sources("{qid}")
    problems, lines = [], ["{qid} {function}"]
    run = run_cases([make_case("units", VISIBLE, srcs, "{qid}", calls=[])], run_dir("{qid}"))
    problems += errors(run.outcomes[0], "{qid}", VISIBLE.describe())
    return finish("{qid}", run, problems, lines)
'''

HIDDEN_TESTS = '''"""Hidden tests of {qid} ({function}): TODO say what they run."""
from .common import case_problems, Item

QID = "{qid}"


def cases(ctx):
    return [ctx.case(QID, "units", label="calls", calls=[])]


def judge(ctx, outcomes):
    return [Item("calls", o.case.label, case_problems(QID, o, o.case.label)) for o in outcomes]
'''

CONTRACT = '''

@_exercise_api("{qid}")
def {function}():
    """TODO: the contract of {qid}: what {function} takes, returns and raises."""
'''


def create(qid: str, function: str, title: str = "TODO title", points: int = 10) -> list[Path]:
    if not re.fullmatch(r"q\d\d", qid) or not re.fullmatch(r"[a-z][a-z0-9_]*", function):
        raise SystemExit("usage: python -m grader new qNN function_name (e.g. q11 p2p_exchange)")
    if qid in EXERCISES:
        raise SystemExit(f"{qid} exists already ({EXERCISES[qid].notebook})")
    module = f"{qid}_{function}"
    written = []

    def put(path: Path, text: str) -> None:
        if path.exists():
            raise SystemExit(f"{path} exists already")
        path.write_text(text)
        written.append(path)

    nb_path = SOURCE / ASSIGNMENT / f"{module}.ipynb"
    nb = jupytext.reads(json.dumps(notebook(qid, function, title, points)), fmt="ipynb")
    if nb_path.exists():
        raise SystemExit(f"{nb_path} exists already")
    jupytext.write(nb, nb_path, fmt="ipynb")
    written.append(nb_path)
    put(nb_path.with_suffix(".py"), as_text(nb_path))
    put(ROOT / "lab_src" / "checks" / f"{module}.py", VISIBLE_CHECK.format(qid=qid, function=function))
    put(ROOT / "grader" / "hidden" / f"{module}.py", HIDDEN_TESTS.format(qid=qid, function=function))

    registry = ROOT / "lab_src" / "registry.py"
    text = registry.read_text()
    entry = f'    Exercise("{qid}", "{function}", "{title}", ()),\n]}}'
    registry.write_text(text.replace("\n]}", "\n" + entry, 1))
    written.append(registry)
    exercises = ROOT / "lab_src" / "exercises.py"
    text = exercises.read_text()
    marker = "\n\n_missing = "
    exercises.write_text(text.replace(marker, CONTRACT.format(qid=qid, function=function).rstrip("\n") + "\n" + marker, 1))
    written.append(exercises)
    return written
