"""The course's nbgrader config, written while other gradings run: never seen half-written, and an autograde that
ran without it is a failure, never a grade (grader/course.py `write_if_changed`, grader/autograde.py)."""
from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from grader.autograde import SANDBOXED_KERNELS, nbgrader_failure
from grader.course import Course, write_if_changed
from grader.execute import START_MARK


def test_the_config_is_replaced_whole_and_only_when_it_changes(tmp_path):
    path = tmp_path / "nbgrader_config.py"
    write_if_changed(path, "a = 1\n")
    inode = path.stat().st_ino
    write_if_changed(path, "a = 1\n")
    assert path.stat().st_ino == inode                  # unchanged: not written again
    seen, texts = set(), ["a = 1\n" * 2000, "b = 2\n" * 2000]
    stop = threading.Event()

    def read():
        while not stop.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            write_if_changed(path, texts[i % 2])
    finally:
        stop.set()
        reader.join()
    assert seen <= {"a = 1\n", *texts}, sorted(len(s) for s in seen)      # never empty, never a part
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_autograde_without_the_course_config_is_a_failure_and_kernels_are_asked_for_the_sandbox(tmp_path):
    """nbgrader that read no config (jun's run in CI: a plain rewrite of the file caught half-done) executes the
    notebooks with nbgrader's defaults: kernels outside the grading sandbox, 30 s a cell. The kernel manager is
    given on the command line too, and a run in which grader/execute.py started no kernel is not a grade."""
    assert SANDBOXED_KERNELS == "--Execute.kernel_manager_class=grader.kernel_sandbox.SandboxedKernelManager"
    course = Course(tmp_path / "course")
    plain = subprocess.CompletedProcess([], 0, "[AutogradeApp | INFO] Autograding q03_activation_shape.ipynb\n", "")
    said = nbgrader_failure(course, "jun", plain)
    assert said and "without the course's configuration" in said, said
    started = subprocess.CompletedProcess([], 0, f"[AutogradeApp | INFO] {START_MARK} after 0.4 s\n", "")
    assert nbgrader_failure(course, "jun", started) == "nbgrader autograde wrote no autograded folder"
