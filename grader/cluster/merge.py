"""Merge the graded task spaces of a run into the course gradebook, through nbgrader's Gradebook API.

For each graded student: the student and the submission (its timestamp), and for every notebook the
late penalty, each grade's auto_score and needs_manual_grade and each comment's auto_comment, as
`nbgrader autograde` plus the verdicts would have left them in the course. What graders entered by
hand (manual scores and comments, extra credit, flags, extensions) is kept. The autograded notebooks
and the grading logs are copied into the course, so `grader feedback`, the formgrader and
`grader status` see the students as if graded there. Merging again writes the same values: idempotent.
"""
from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from lab_src.registry import CODED

from ..course import COURSE_ID, Course
from ..verdicts import gradebook_lock
from .runs import Run, effective_state
from .task import UNPUBLISHED

# The cells whose score the out-of-process verdicts set (never flagged for review, see verdicts.py).
VERDICT_CELLS = {ex.hidden_cell for ex in CODED}


def copy_submission(src, dst, student: str, assignment: str) -> int:
    """Copy one student's autograding from Gradebook `src` (a task space) into Gradebook `dst`.
    Returns the number of grades written."""
    sub = src.find_submission(assignment, student)
    dst.update_or_create_student(student)
    kwargs = {"timestamp": sub.timestamp} if sub.timestamp is not None else {}
    dst_sub = dst.update_or_create_submission(assignment, student, **kwargs)
    notebooks = {nb.name: nb for nb in dst_sub.notebooks}
    written = 0
    for nb in sub.notebooks:
        target = notebooks.get(nb.name)
        if target is None:
            raise RuntimeError(f"the course's assignment has no notebook {nb.name}: was it released again "
                               f"after this run was submitted?")
        target.late_submission_penalty = nb.late_submission_penalty
        grades = {g.name: g for g in target.grades}
        for g in nb.grades:
            t = grades[g.name]
            t.auto_score = g.auto_score
            # nbgrader flags a re-autograded cell for review when a grader had scored it by hand
            t.needs_manual_grade = g.needs_manual_grade or (t.manual_score is not None and g.name not in VERDICT_CELLS)
            written += 1
        comments = {c.name: c for c in target.comments}
        for c in nb.comments:
            comments[c.name].auto_comment = c.auto_comment
    dst.db.commit()
    return written


def _replace_tree(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    if src.exists():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(*UNPUBLISHED))


def merge_student(course: Course, space: Course, student: str) -> None:
    from nbgrader.api import Gradebook
    from sqlalchemy.exc import SAWarning
    with Gradebook(f"sqlite:///{space.db_path}", COURSE_ID) as src, \
            Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as dst, warnings.catch_warnings():
        warnings.simplefilter("ignore", SAWarning)  # nbgrader's add_submission trips SQLAlchemy's autoflush warnings
        copy_submission(src, dst, student, course.assignment)
    _replace_tree(space.autograded(student), course.autograded(student))
    _replace_tree(space.grading_dir(student), course.grading_dir(student))


def merge(run: Run, students: list[str] | None = None, live_jobs: set[str] | None = None) -> dict[str, list[str]]:
    """Merge every graded student of the run (or of `students`). Returns {"merged": [...], "skipped": [...]}.

    A student left "running" by a job that is no longer queued (`live_jobs`) is recorded as failed."""
    course = run.course
    merged, skipped = [], []
    with gradebook_lock(course):
        for student in students or run.students():
            state = run.state(student)
            status = effective_state(state, live_jobs)
            if status == "failed" and state and state["state"] == "running":
                run.write_state(student, "failed", error="its task ended without a result (node failure, or "
                                "killed without SIGTERM)", **{k: state.get(k) for k in ("job", "array_task", "host")})
            if status != "graded" or not (run.space_dir(student) / "gradebook.db").exists():
                skipped.append(student)
                continue
            merge_student(course, run.space(student), student)
            merged.append(student)
    return {"merged": merged, "skipped": skipped}


def export(course: Course, to: Path) -> list[Path]:
    """nbgrader's grades.csv and the per-exercise CSV beside it (grader's own export command)."""
    from ..cli import main as grader_main
    grader_main(["--course", str(course.root), "export", "--to", str(to)])
    return [Path(to), Path(to).with_name(Path(to).stem + "_by_exercise.csv")]
