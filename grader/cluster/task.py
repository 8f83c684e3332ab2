"""One array task: grade its students, each in a task space of its own, and publish the spaces.

A task space is a course folder (grader.course.Course) holding one student: a copy of the run's
template gradebook, the student's submission, and what grader.autograde.grade_student writes. It is
built in node-local scratch ($LAB_SCRATCH, else $TMPDIR, else /tmp), where SQLite is safe and a killed
task leaves nothing half-written on the shared file system, and moved to <run>/spaces/<student>/ only
once graded. Slurm ends a cancelled or timed-out task with SIGTERM (then SIGKILL): the task records
"failed" for the student it was grading and exits; a task killed outright (node failure) leaves
"running" behind, which `status` and `merge` recognise once the job has left the queue.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sqlite3
import tempfile
import time
from pathlib import Path

from ..autograde import grade_student
from ..course import Course
from ..verdicts import gradebook_lock
from .runs import Run, course_at

# Bulky, regenerable files of a grading (tensors the hidden tests compared) that are not published.
UNPUBLISHED = ("baselines", "obs", ".ipynb_checkpoints")
# nbgrader's tables that hold students and what they submitted: emptied in the template.
STUDENT_TABLES = ("comment", "grade", "submitted_notebook", "submitted_assignment", "student")


class Terminated(BaseException):
    """SIGTERM: the job was cancelled, hit its time limit, or the node is going down."""


def _on_sigterm(signum, frame):
    raise Terminated()


def make_template(course: Course, path: Path) -> Path:
    """A gradebook with the course's assignment (notebooks, cells, points) and no students."""
    course.ensure_assignment()
    tmp = path.with_name(f".{path.name}.tmp")
    with gradebook_lock(course):
        src, dst = sqlite3.connect(course.db_path), sqlite3.connect(tmp)
        try:
            src.backup(dst)
        finally:
            src.close()
    try:
        dst.executescript("".join(f"DELETE FROM {t};" for t in STUDENT_TABLES))
        dst.commit()
        dst.execute("VACUUM")
    finally:
        dst.close()
    os.replace(tmp, path)
    return path


def job_fields() -> dict:
    env = os.environ
    task = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}" if "SLURM_ARRAY_JOB_ID" in env else None
    return {"job": env.get("SLURM_JOB_ID", f"pid{os.getpid()}"), "array_task": task, "host": socket.gethostname()}


def prepare_space(run: Run, student: str, root: Path) -> Course:
    space = course_at(run.course, root)
    space.root.mkdir(parents=True)
    shutil.copy(run.template_db, space.db_path)
    shutil.copytree(run.course.submitted(student), space.submitted(student),
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    space.add_students([student])
    return space


def publish(src: Path, dest: Path) -> None:
    """Copy a graded space to the run folder, replacing an earlier one only once the copy is whole."""
    tag = f"{socket.gethostname()}.{os.getpid()}"
    partial, old = dest.with_name(f".{dest.name}.{tag}.partial"), dest.with_name(f".{dest.name}.{tag}.old")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(src, partial, ignore=shutil.ignore_patterns(*UNPUBLISHED))
    if dest.exists():
        os.replace(dest, old)
    os.replace(partial, dest)
    shutil.rmtree(old, ignore_errors=True)


def keep_logs(run: Run, space: Course, student: str) -> None:
    """A failed grading's logs, for the instructor: <run>/logs/<student>/."""
    dest = run.logs / student
    shutil.rmtree(dest, ignore_errors=True)
    for log in space.grading_dir(student).rglob("*.log"):
        target = dest / log.relative_to(space.grading_dir(student))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, target)


def grade_one(run: Run, student: str, scratch: Path | None = None) -> bool:
    """Grade `student` in a fresh task space; True when graded. Raises Terminated on SIGTERM."""
    job = job_fields()
    run.write_state(student, "running", **job)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"pp-lab-{student}-", dir=scratch) as tmp:
        space = None
        try:
            space = prepare_space(run, student, Path(tmp) / student)
            summary = grade_student(space, student, os.environ.get("LAB_UNSAFE_NO_SANDBOX") == "1")
            publish(space.root, run.space_dir(student))
        except Terminated:
            run.write_state(student, "failed", error="terminated by SIGTERM: cancelled, or over the time limit",
                            wall_s=round(time.monotonic() - started, 1), **job)
            raise
        except Exception as e:  # noqa: BLE001 - recorded; the task goes on with its other students
            if space is not None:
                keep_logs(run, space, student)
            run.write_state(student, "failed", error=f"{type(e).__name__}: {e}"[:4000],
                            wall_s=round(time.monotonic() - started, 1), **job)
            return False
        if summary["state"] != "graded":   # the hidden tests ran, nbgrader's autograde did not succeed
            keep_logs(run, space, student)
            run.write_state(student, "failed", error=summary["error"], wall_s=summary["wall_s"], **job)
            return False
    run.write_state(student, "graded", scores=summary["scores"], wall_s=summary["wall_s"], **job)
    return True


def run_task(run: Run, students: list[str], scratch: Path | None = None) -> int:
    """Grade `students` one after the other. Exit status: 0 all graded, 1 some failed, 143 terminated."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _grade_in_turn(run, students, scratch)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _grade_in_turn(run: Run, students: list[str], scratch: Path | None) -> int:
    failed = 0
    for i, student in enumerate(students):
        print(f"[{time.strftime('%H:%M:%S')}] grading {student} ({i + 1}/{len(students)})", flush=True)
        try:
            ok = grade_one(run, student, scratch)
        except Terminated:
            for rest in students[i + 1:]:
                if (run.state(rest) or {}).get("state") != "graded":
                    run.write_state(rest, "failed", error="not started: its task was terminated", **job_fields())
            print(f"terminated while grading {student}", flush=True)
            return 143
        failed += not ok
        print(f"  {student}: {run.state(student)['state']}", flush=True)
    return 1 if failed else 0
