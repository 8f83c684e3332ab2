"""Autograde one student, or all: nbgrader, then the out-of-process hidden tests, then the gradebook.

For each student:
1. `nbgrader autograde` executes the submitted notebooks (restoring test cells, giving zero to missing
   notebooks, recording the manually graded cells);
2. `python -P -m grader.trusted` grades the answer cells of the submitted notebooks in fresh processes,
   from a folder outside the submission;
3. grader/verdicts.py writes those verdicts into the gradebook and the autograded notebooks.

The hidden tests run first, so that nbgrader's execution of the notebooks can draw the grader's run of
the student's code in the timeline cells (lab_src.checks.autograding_report); the verdicts go into
the gradebook last, after nbgrader has written its own scores. A status file per student
(course/grader/<student>/status.json) says whether grading is running, done or failed; `grader status`
counts them. Grading several students at once is safe: each has its own
work folder, torchrun picks free ports, and gradebook writes take a lock.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lab_src.grading import GRADER_TIMELINES
from lab_src.registry import ASSIGNMENT

from . import verdicts
from .course import Course, tool_env
from .kernel_sandbox import UNSAFE

NBGRADER_TIMEOUT_S = 900
TRUSTED_TIMEOUT_S = 900
VERDICTS_LIMIT_BYTES = 8 << 20


def status_path(course: Course, student: str) -> Path:
    return course.root / "grader" / student / "status.json"


def write_status(course: Course, student: str, **fields) -> None:
    path = status_path(course, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"student": student, "time": time.time(), **fields}))
    os.replace(tmp, path)


def run_trusted(course: Course, student: str, unsafe_no_sandbox: bool = False) -> dict:
    """The hidden tests of one submission, in a fresh `python -P` process run outside the submission.
    Its verdicts come back through a pipe only it holds (never parsed out of anybody's output)."""
    work = course.root / "grader" / student / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-P", "-m", "grader.trusted", str(course.submitted(student)), "--work", str(work),
           "--verdicts-fd", str(write_end)] + (["--unsafe-no-sandbox"] if unsafe_no_sandbox else [])
    with tempfile.TemporaryDirectory(prefix="pp-lab-grade-") as cwd, open(work.parent / "trusted.log", "wb") as log:
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **tool_env(), "PYTHONSAFEPATH": "1"},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    pass_fds=(write_end,))
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as channel:
            text = channel.read(VERDICTS_LIMIT_BYTES)
        try:
            code = proc.wait(timeout=TRUSTED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    if code != 0 or not text:
        tail = (work.parent / "trusted.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"the hidden tests of {student} did not run (exit {code}):\n{tail}")
    result = json.loads(text)
    (work.parent / "verdicts.json").write_text(json.dumps(result, indent=1))
    return result


def grade_student(course: Course, student: str, unsafe_no_sandbox: bool = False) -> dict:
    started = time.monotonic()
    write_status(course, student, state="running", host=os.uname().nodename)
    try:
        result = run_trusted(course, student, unsafe_no_sandbox)
        t_hidden = time.monotonic()
        timelines = course.root / "grader" / student / "work" / "timeline"
        nb = course.nbgrader("autograde", ASSIGNMENT, "--student", student, "--force", check=False,
                             timeout=NBGRADER_TIMEOUT_S,
                             env={GRADER_TIMELINES: str(timelines), **({UNSAFE: "1"} if unsafe_no_sandbox else {})})
        log = course.root / "grader" / student / "nbgrader.log"
        log.write_text(nb.stdout[-50000:] + "\n" + nb.stderr[-50000:])
        t_nbgrader = time.monotonic()
        given = verdicts.apply(course, student, result)
    except Exception as e:  # noqa: BLE001 - one student's failure is recorded, the others go on
        write_status(course, student, state="failed", error=f"{type(e).__name__}: {e}"[:4000],
                     wall_s=round(time.monotonic() - started, 1))
        raise
    done = time.monotonic()
    summary = {"state": "graded", "scores": given, "nbgrader_exit": nb.returncode, "cases": result["cases"],
               "launches": result["launches"], "wall_s": round(done - started, 1),
               "phases_s": {"hidden_tests": round(t_hidden - started, 1), "nbgrader": round(t_nbgrader - t_hidden, 1),
                            "gradebook": round(done - t_nbgrader, 1)}}
    write_status(course, student, **summary)
    return summary


def grade_all(course: Course, students: list[str], jobs: int = 1, on_done=None,
              unsafe_no_sandbox: bool = False) -> dict[str, dict]:
    """Grade `students`, `jobs` at a time. Failures are reported in the result, not raised."""
    course.ensure_assignment()
    course.add_students(students)

    def one(student):
        try:
            out = grade_student(course, student, unsafe_no_sandbox)
        except Exception as e:  # noqa: BLE001
            out = {"state": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
        if on_done:
            on_done(student, out)
        return student, out

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return dict(pool.map(one, students))
