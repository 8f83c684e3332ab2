"""A kernel that starts slowly: nbgrader's kernel start is retried (grader/execute.py), and a student whose
nbgrader autograde failed anyway is `failed` with the reason, never `graded`.

The slow kernel is a real one: a kernelspec named python3 (found first on JUPYTER_PATH) whose launcher,
the first time it runs, sleeps instead of answering, and afterwards starts ipykernel. nbgrader's startup
limit is lowered for the test; the course's default is KERNEL_STARTUP_TIMEOUT_S (lab_src/harness/limits.py).
The course hands out the tensor-parallel module alone (two notebooks, needing no other module): what is tested
is a kernel's start, which every notebook's kernel goes through alike, and ten notebooks' kernels would cost
make test a minute.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from grader.autograde import grade_student, nbgrader_failure
from grader.cli import collect_folder
from grader.cli import main as grader_cli
from grader.cohort import BY_NAME, build_student
from grader.course import Course
from grader.formgrader_view import problems
from grader.plan import write as write_plan
from grader.report import format_table, grade_rows
from lab_src.registry import MODULES

pytestmark = pytest.mark.slow

LIMIT_S = 15
MODULE = "tensor_parallel"
# without a retry, the first start fails whatever the limit (its kernel sleeps): a short one, for make test's time
NO_RETRY_LIMIT_S = 5

SLOW_FIRST_START = '''
import os, sys, time
marker = sys.argv[1]
if not os.path.exists(marker):          # the first start of the test: a kernel that does not answer
    open(marker, "w").close()
    time.sleep(600)
os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *sys.argv[2:]])
'''


@pytest.fixture
def slow_first_kernel(tmp_path, monkeypatch):
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "slow_start.py").write_text(SLOW_FIRST_START)
    marker = tmp_path / "first-start-happened"
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, str(spec / "slow_start.py"), str(marker), "-f", "{connection_file}"],
        "display_name": "Python 3 (slow first start)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    # where nbgrader's kernels run in the grading sandbox, this kernelspec's script is out of the kernel's
    # sight: start them as nbgrader would (the hidden tests stay sandboxed; the retry is the same)
    monkeypatch.setenv("LAB_UNSAFE_NO_SANDBOX", "1")
    return marker


def course_with(tmp_path: Path, student: str, retries: int, limit_s: int = LIMIT_S) -> Course:
    build_student(BY_NAME[student], tmp_path / "returned")
    write_plan(tmp_path / "course", [MODULE])
    course = Course(tmp_path / "course", startup_timeout=limit_s, startup_retries=retries)
    assert [e.id for e in course.exercises] == list(MODULES[MODULE])
    collect_folder(course, tmp_path / "returned")
    course.ensure_assignment()
    return course


def test_a_kernel_that_does_not_answer_is_started_again(tmp_path, slow_first_kernel):
    """nbgrader's half alone (the hidden tests have nothing to do with kernels): autograde through the
    course's config, which puts grader.execute.RetryingExecute in nbgrader's place."""
    course = course_with(tmp_path, "untouched", retries=1)
    proc = course.nbgrader("autograde", MODULE, "--student", "untouched", "--force", check=False)
    log = proc.stdout + proc.stderr
    assert slow_first_kernel.exists(), "the slow kernel was never started"
    assert f"KERNEL-START-RETRY the kernel did not answer within {LIMIT_S} s" in log
    assert log.count("KERNEL-START answered after") == len(course.exercises)   # every notebook's kernel answered
    assert nbgrader_failure(course, "untouched", proc) is None
    assert problems(course, feedback=False) == {}


def test_without_a_retry_the_student_is_failed_with_the_reason(tmp_path, slow_first_kernel, capsys):
    course = course_with(tmp_path, "untouched", retries=0, limit_s=NO_RETRY_LIMIT_S)
    out = grade_student(course, "untouched")
    assert out["state"] == "failed" and out["nbgrader_exit"] == 1
    assert f"its kernel did not answer within {NO_RETRY_LIMIT_S} s, or died" in out["error"], out
    # nbgrader's own view agrees: the formgrader lists the submission as not autograded
    assert "not autograded" in problems(course, feedback=False)["untouched"]
    # and the instructor's commands say so
    table = format_table(grade_rows(course))
    assert "FAILED" in table and "its kernel did not answer" in table
    capsys.readouterr()
    grader_cli(["--course", str(course.root), "status"])
    status = capsys.readouterr().out
    assert "1 failed" in status and "failed: untouched: nbgrader autograde failed" in status
    assert grader_cli(["--course", str(course.root), "feedback"]) == 1
    assert "NO FEEDBACK for untouched: the formgrader shows it as not autograded" in capsys.readouterr().out
