"""Autograde one student, or all: nbgrader, then the out-of-process hidden tests, then the gradebook.

For each student:
1. `python -P -m grader.trusted` grades the answer cells of the submitted notebooks in fresh processes,
   from a folder outside the submission;
2. `nbgrader autograde` executes the notebooks (restoring test cells, giving zero to missing
   notebooks, recording the manually graded cells), from a copy of the submission in which a notebook
   nbgrader cannot read is replaced by a note saying why (grader/staging.py), so that it costs only itself;
3. grader/verdicts.py writes those verdicts into the gradebook and the autograded notebooks.

The hidden tests run first, so that nbgrader's execution of the notebooks can draw the grader's run of
the student's code in the timeline cells (lab_src.checks.autograding_report); the verdicts go into
the gradebook last, after nbgrader has written its own scores. A status file per student
(course/grader/<student>/status.json) says whether grading is running, done or failed; a student is
graded only when both halves succeeded (the hidden tests, and nbgrader's autograde as nbgrader's own
formgrader sees it); `grader status` counts them. Grading several students at once is safe: each has its own
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

from . import verdicts
from .course import COURSE_ID, Course, tool_env
from .execute import RETRY_MARK
from .kernel_sandbox import UNSAFE
from .staging import stage_submission

# Students graded at once by default (`grader autograde --jobs`): one per core, at most 4. Measured on 2
# cores (benchmarks/kernel_start.py, README "Kernel start under load"): no kernel start failed at 2 or 4.
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))
NBGRADER_TIMEOUT_S = 900
TRUSTED_TIMEOUT_S = 900
VERDICTS_LIMIT_BYTES = 8 << 20


def status_path(course: Course, student: str) -> Path:
    return course.grading_dir(student) / "status.json"


def write_status(course: Course, student: str, **fields) -> None:
    path = status_path(course, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"student": student, "time": time.time(), **fields}))
    os.replace(tmp, path)


def run_trusted(course: Course, student: str, unsafe_no_sandbox: bool = False) -> dict:
    """The hidden tests of one submission, in a fresh `python -P` process run outside the submission.
    Its verdicts come back through a pipe only it holds (never parsed out of anybody's output)."""
    work = course.grading_dir(student) / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-P", "-m", "grader.trusted", str(course.submitted(student)), "--work", str(work),
           "--verdicts-fd", str(write_end), "--only", *[e.id for e in course.exercises]] + (["--unsafe-no-sandbox"] if unsafe_no_sandbox else [])
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


def nbgrader_failure(course: Course, student: str, proc: subprocess.CompletedProcess) -> str | None:
    """Why nbgrader's half of grading `student` did not succeed, or None when it did: nbgrader's exit
    status, and what nbgrader's own formgrader reads (the autograded folder, the submission in the gradebook)."""
    from nbgrader.api import Gradebook, MissingEntry
    if proc.returncode != 0:
        text = proc.stdout + "\n" + proc.stderr
        if "Kernel didn't respond" in text or "Kernel died before replying" in text:
            tries = 1 + course.startup_retries
            return (f"nbgrader autograde failed (exit {proc.returncode}): its kernel did not answer within "
                    f"{course.startup_timeout} s, or died, {tries} time{'s' if tries > 1 else ''} (a loaded node: "
                    f"grade with fewer --jobs)")
        errors = [ln for ln in text.splitlines() if "| ERROR]" in ln or "Error" in ln]
        return f"nbgrader autograde failed (exit {proc.returncode}): " + (errors[-1].strip()[:500] if errors else
                                                                          "see its log")
    if not course.autograded(student).is_dir():
        return "nbgrader autograde wrote no autograded folder"
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        try:
            gb.find_submission(course.assignment, student)
        except MissingEntry:
            return "nbgrader autograde recorded no submission in the gradebook"
    return None


def grade_student(course: Course, student: str, unsafe_no_sandbox: bool = False) -> dict:
    """Both halves: the hidden tests out of process, and nbgrader's autograde. The student is `graded`
    only when both succeeded; otherwise `failed`, with the reason (the verdicts that could be written
    are written all the same)."""
    started = time.monotonic()
    write_status(course, student, state="running", host=os.uname().nodename)
    try:
        result = run_trusted(course, student, unsafe_no_sandbox)
        t_hidden = time.monotonic()
        unreadable = stage_submission(course, student)
        timelines = course.grading_dir(student) / "work" / "timeline"
        nb = course.nbgrader("autograde", course.assignment, "--student", student, "--force",
                             f"--CourseDirectory.submitted_directory={course.grading_root.name}", check=False,
                             timeout=NBGRADER_TIMEOUT_S,
                             env={GRADER_TIMELINES: str(timelines), **({UNSAFE: "1"} if unsafe_no_sandbox else {})})
        log = course.grading_dir(student) / "nbgrader.log"
        log.write_text(nb.stdout[-50000:] + "\n" + nb.stderr[-50000:])
        t_nbgrader = time.monotonic()
        failure = nbgrader_failure(course, student, nb)
        given = verdicts.apply(course, student, result)
    except Exception as e:  # noqa: BLE001 - one student's failure is recorded, the others go on
        write_status(course, student, state="failed", error=f"{type(e).__name__}: {e}"[:4000],
                     wall_s=round(time.monotonic() - started, 1))
        raise
    done = time.monotonic()
    summary = {"state": "failed" if failure else "graded", "scores": given, "nbgrader_exit": nb.returncode,
               "unreadable": unreadable, "cases": result["cases"],
               "launches": result["launches"], "wall_s": round(done - started, 1),
               "kernel_start_retries": nb.stdout.count(RETRY_MARK) + nb.stderr.count(RETRY_MARK),
               "phases_s": {"hidden_tests": round(t_hidden - started, 1), "nbgrader": round(t_nbgrader - t_hidden, 1),
                            "gradebook": round(done - t_nbgrader, 1)}}
    if failure:
        summary["error"] = failure
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


def grade_course(course: Course, students: list[str] | None = None, jobs: int = 1, on_done=None,
                 unsafe_no_sandbox: bool = False, assignment: str | None = None) -> dict[str, dict]:
    """Grade every assignment of the course (or `assignment`) that `students` (default: each one who
    returned it) returned. Returns {student: the core assignment's summary, or the first graded one's, with
    "state" the worst of all and "assignments": {assignment: its summary}}."""
    merged: dict[str, dict] = {}
    for one in course.each(assignment):
        chosen = [s for s in (students or one.students()) if one.submitted(s).is_dir()]
        if not chosen:
            continue
        done = (lambda s, out, a=one.assignment: on_done(s, {**out, "assignment": a})) if on_done else None
        for student, out in grade_all(one, chosen, jobs, done, unsafe_no_sandbox).items():
            row = merged.setdefault(student, {**out, "assignments": {}})
            row["assignments"][one.assignment] = out
            if out["state"] != "graded" and row["state"] == "graded":
                row.update(state=out["state"], error=f"{one.assignment}: {out.get('error', '')}")
    return merged
