"""Record the out-of-process verdicts: scores into the gradebook, messages into the autograded notebooks.

nbgrader scores a hidden-test cell by whether it raised in the student's kernel, which the student's
own code could arrange. Here each hidden-test cell's `auto_score` is overwritten with the verdict of
grader/trusted.py, through nbgrader's Gradebook API, and the cell's output in the autograded notebook is
replaced by the verdict's messages, which is what the feedback shows (without the hidden tests' code).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
from pathlib import Path

from lab_src.registry import exercise

from .course import COURSE_ID, Course


@contextlib.contextmanager
def gradebook_lock(course: Course):
    """One writer at a time: SQLite on a shared file system does not like concurrent writers."""
    course.root.mkdir(parents=True, exist_ok=True)
    with open(course.root / ".gradebook.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def verdict_text(qid: str, verdict: dict, points: float) -> str:
    got = round(verdict["fraction"] * points, 2)
    return "\n".join([f"Score {got:g} / {points:g}"] + verdict["messages"]) + "\n"


def apply(course: Course, student: str, result: dict) -> dict[str, float]:
    """Write the scores (and the messages) for `student`; returns {qid: points given}."""
    from nbgrader.api import Gradebook, MissingEntry
    points = course.hidden_points()
    given = {}
    with gradebook_lock(course), Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        for qid, verdict in result["exercises"].items():
            ex = exercise(qid)
            score = round(verdict["fraction"] * points[qid], 2)
            try:
                grade = gb.find_grade(ex.hidden_cell, Path(ex.notebook).stem, course.assignment, student)
            except MissingEntry:
                continue  # nbgrader made no record of this notebook for this student (see autograde.py)
            grade.auto_score = score
            grade.needs_manual_grade = False
            given[qid] = score
        gb.db.commit()
    for qid, verdict in result["exercises"].items():
        _write_output(course.autograded(student) / exercise(qid).notebook, qid, verdict_text(qid, verdict, points[qid]))
    return given


def _write_output(path: Path, qid: str, text: str) -> None:
    if not path.exists():
        return
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == exercise(qid).hidden_cell:
            cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": text}]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
