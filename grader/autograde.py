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
work folder, torchrun picks free ports, and gradebook writes take a lock. A course of several assignments
grades each student's returned assignments together (grade_course, grade_student_course): steps 1 and 2
once over all of them, step 3 per assignment, so that modules cost no more than one assignment did.
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
from lab_src.harness import limits
from lab_src.registry import MODULES

from . import verdicts
from .course import COURSE_ID, Course, tool_env
from .execute import RETRY_MARK, START_MARK
from .kernel_sandbox import SHARED, UNSAFE
from .staging import stage_submission

# Students graded at once by default (`grader autograde --jobs`): one per core, at most 4. Measured on 2
# cores (benchmarks/kernel_start.py, README "Kernel start under load"): no kernel start failed at 2 or 4.
DEFAULT_JOBS = max(1, min(4, os.cpu_count() or 1))


def status_path(course: Course, student: str) -> Path:
    return course.grading_dir(student) / "status.json"


def write_status(course: Course, student: str, **fields) -> None:
    path = status_path(course, student)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"student": student, "time": time.time(), **fields}))
    os.replace(tmp, path)


def run_trusted(course: Course, student: str, unsafe_no_sandbox: bool = False,
                parts: list[Course] | None = None, folder: Path | None = None) -> dict:
    """The hidden tests of one submission (or of one student's several assignments, `parts`, graded in
    one launch with one set of baselines), in a fresh `python -P` process run outside the submission.
    Its verdicts come back through a pipe only it holds (never parsed out of anybody's output)."""
    parts = parts or [course]
    folder = folder or course.grading_dir(student)
    work = folder / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    read_end, write_end = os.pipe()
    cmd = [sys.executable, "-P", "-m", "grader.trusted", *[str(p.submitted(student)) for p in parts],
           "--work", str(work), "--verdicts-fd", str(write_end),
           "--only", *[e.id for p in parts for e in p.exercises]] + (["--unsafe-no-sandbox"] if unsafe_no_sandbox else [])
    with tempfile.TemporaryDirectory(prefix="pp-lab-grade-") as cwd, open(folder / "trusted.log", "wb") as log:
        try:
            proc = subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **tool_env(), "PYTHONSAFEPATH": "1"},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    pass_fds=(write_end,))
        finally:
            os.close(write_end)
        with os.fdopen(read_end, "rb") as channel:
            text = channel.read(limits.VERDICTS_LIMIT_BYTES)
        try:
            code = proc.wait(timeout=limits.TRUSTED_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
    if code != 0 or not text:
        tail = (folder / "trusted.log").read_text(errors="replace")[-3000:]
        last = next((ln.strip() for ln in reversed(tail.splitlines()) if ln.strip()), "nothing in trusted.log")
        # the cause first: the messages that carry this are cut to their first few hundred characters
        raise RuntimeError(f"the hidden tests of {student} did not run (exit {code}): {last[:300]}\n"
                           f"(the end of {folder / 'trusted.log'}:)\n{tail}")
    result = json.loads(text)
    (folder / "verdicts.json").write_text(json.dumps(result, indent=1))
    return result


# On nbgrader's command line as well as in the course's config: the kernels that run a student's cells are the
# grading sandbox's even where an nbgrader read no config (grader/course.py `write_if_changed`)
SANDBOXED_KERNELS = "--Execute.kernel_manager_class=grader.kernel_sandbox.SandboxedKernelManager"


def nbgrader_failure(course: Course, student: str, proc: subprocess.CompletedProcess) -> str | None:
    """Why nbgrader's half of grading `student` did not succeed, or None when it did: nbgrader's exit
    status, whether it ran with the course's config (its kernels started by grader/execute.py, which logs each
    start), and what nbgrader's own formgrader reads (the autograded folder, the submission in the gradebook)."""
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
    if START_MARK not in proc.stdout + proc.stderr:
        return ("nbgrader autograde ran without the course's configuration (no kernel was started by "
                "grader/execute.py): its notebooks were executed with nbgrader's defaults. Grade the student again")
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
        nb = course.nbgrader("autograde", course.assignment, "--student", student, "--force", SANDBOXED_KERNELS,
                             f"--CourseDirectory.submitted_directory={course.grading_root.name}", check=False,
                             timeout=limits.nbgrader_timeout_s(len({e.notebook for e in course.exercises})),
                             env={GRADER_TIMELINES: str(timelines), SHARED: str(course.autograded(student).parent),
                                  **({UNSAFE: "1"} if unsafe_no_sandbox else {})})
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


def grade_student_course(course: Course, student: str, parts: list[Course],
                         unsafe_no_sandbox: bool = False) -> dict[str, dict]:
    """Every assignment of `parts` that `student` returned, graded as one: one run of the hidden tests over
    all of them (one sandbox, one set of baselines, as when the lab was one assignment), one `nbgrader
    autograde` over their copies staged side by side in <course>/grader/<student>/<assignment>/, then each
    assignment's verdicts and status. Returns {assignment: its summary, as grade_student's}."""
    if len(parts) == 1:
        return {parts[0].assignment: grade_student(parts[0], student, unsafe_no_sandbox)}
    started = time.monotonic()
    home = course.root / "grader" / student        # the core assignment's grading folder (Course.grading_root)
    home.mkdir(parents=True, exist_ok=True)
    for part in parts:
        write_status(part, student, state="running", host=os.uname().nodename)
    try:
        result = run_trusted(course, student, unsafe_no_sandbox, parts=parts, folder=home)
        t_hidden = time.monotonic()
        for stale in home.iterdir():    # an assignment staged earlier and not returned now is not regraded
            if stale.name in MODULES and stale.name not in {p.assignment for p in parts}:
                shutil.rmtree(stale)
        unreadable = {p.assignment: stage_submission(p, student, home / p.assignment) for p in parts}
        # nbgrader takes the assignment as a glob: "*" autogrades every one staged in grader/<student>/
        nb = course.nbgrader("autograde", "*", "--student", student, "--force", SANDBOXED_KERNELS,
                             "--CourseDirectory.submitted_directory=grader", check=False,
                             timeout=limits.nbgrader_timeout_s(len({e.notebook for p in parts for e in p.exercises})),
                             env={GRADER_TIMELINES: str(home / "work" / "timeline"),
                                  SHARED: str(course.autograded(student).parent),   # one kernels' fork server
                                  **({UNSAFE: "1"} if unsafe_no_sandbox else {})})
        (home / "nbgrader.log").write_text(nb.stdout[-50000:] + "\n" + nb.stderr[-50000:])
        t_nbgrader = time.monotonic()
    except Exception as e:  # noqa: BLE001 - one student's failure is recorded, the others go on
        for part in parts:
            write_status(part, student, state="failed", error=f"{type(e).__name__}: {e}"[:4000],
                         wall_s=round(time.monotonic() - started, 1))
        raise
    summaries = {}
    for part in parts:
        mine = {q: v for q, v in result["exercises"].items() if q in {e.id for e in part.exercises}}
        t0 = time.monotonic()
        try:
            failure = nbgrader_failure(part, student, nb)
            given = verdicts.apply(part, student, {**result, "exercises": mine})
            if part.grading_dir(student) != home:
                (part.grading_dir(student) / "verdicts.json").write_text(json.dumps({**result, "exercises": mine}, indent=1))
        except Exception as e:  # noqa: BLE001
            write_status(part, student, state="failed", error=f"{type(e).__name__}: {e}"[:4000],
                         wall_s=round(time.monotonic() - started, 1))
            summaries[part.assignment] = {"state": "failed", "error": f"{type(e).__name__}: {e}"[:2000]}
            continue
        summary = {"state": "failed" if failure else "graded", "scores": given, "nbgrader_exit": nb.returncode,
                   "unreadable": unreadable[part.assignment], "cases": result["cases"],
                   "launches": result["launches"], "wall_s": round(time.monotonic() - started, 1),
                   "kernel_start_retries": nb.stdout.count(RETRY_MARK) + nb.stderr.count(RETRY_MARK),
                   "phases_s": {"hidden_tests": round(t_hidden - started, 1), "nbgrader": round(t_nbgrader - t_hidden, 1),
                                "gradebook": round(time.monotonic() - t0, 1)},
                   "graded_with": [p.assignment for p in parts]}
        if failure:
            summary["error"] = failure
        write_status(part, student, **summary)
        summaries[part.assignment] = summary
    return summaries


def grade_course(course: Course, students: list[str] | None = None, jobs: int = 1, on_done=None,
                 unsafe_no_sandbox: bool = False, assignment: str | None = None) -> dict[str, dict]:
    """Grade every assignment of the course (or `assignment`) that `students` (default: each one who
    returned one) returned, each student's assignments together (grade_student_course), `jobs` students at
    a time. Returns {student: the core assignment's summary, or the first graded one's, with "state" the
    worst of all and "assignments": {assignment: its summary}}."""
    parts = course.each(assignment)
    for part in parts:
        part.ensure_assignment()
    students = students or sorted({s for p in parts for s in p.students()})
    course.add_students(students)

    def one(student):
        mine = [p for p in parts if p.submitted(student).is_dir()]
        if not mine:
            return student, {}
        try:
            outs = grade_student_course(course, student, mine, unsafe_no_sandbox)
        except Exception as e:  # noqa: BLE001
            outs = {p.assignment: {"state": "failed", "error": f"{type(e).__name__}: {e}"[:2000]} for p in mine}
        if on_done:
            for a, out in outs.items():
                on_done(student, {**out, "assignment": a})
        return student, outs

    merged: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for student, outs in pool.map(one, students):
            for a, out in outs.items():
                row = merged.setdefault(student, {**out, "assignments": {}})
                row["assignments"][a] = out
                if out["state"] != "graded" and row["state"] == "graded":
                    row.update(state=out["state"], error=f"{a}: {out.get('error', '')}")
    return merged
