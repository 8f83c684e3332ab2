"""nbgrader's Validate (the Assignments panel's button, `nbgrader validate`) tells the truth.

Validate runs the notebook with NBGRADER_EXECUTION=validate: the visible check runs for real (only
autograde skips it), and the release's test cell fails unless the check passed, with the check's own
message (lab_src.grading.require_check). Here the released q05 notebook, unanswered, with a wrong
answer and with a correct one, in a student's folder that holds the answers to q02 and q03.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader.cohort.answers import answer
from lab_src import grading
from lab_src.registry import EXERCISES

Q05_LATE_EXTRA = answer("q05_late_extra")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "pipeline_lab" / EXERCISES["q05"].notebook
# what a course gives its students' nbgrader (see README): nbgrader's default of 30 s a cell is too short
# for a torchrun check on a loaded node
STUDENT_CONFIG = "c = get_config()\nc.Execute.timeout = 300\n"


def workspace(folder: Path, answer: str | None, reference) -> Path:
    folder.mkdir(parents=True)
    nb = json.loads(NOTEBOOK.read_text())
    if answer is not None:
        cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "q05_answer")
        cell["source"] = "%%answer q05\n" + answer.strip("\n")
    (folder / NOTEBOOK.name).write_text(json.dumps(nb, indent=1))
    (folder / "answers").mkdir()
    for qid in ("q02", "q03"):
        shutil.copyfile(reference[qid], folder / "answers" / EXERCISES[qid].answer_file)
    (folder / "nbgrader_config.py").write_text(STUDENT_CONFIG)
    return folder


def validate(folder: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", NOTEBOOK.name], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=600)
    print(f"nbgrader validate ({folder.name}): {time.monotonic() - started:.1f} s\n{proc.stdout}")
    return proc.stdout


@pytest.mark.q05
@pytest.mark.slow
@pytest.mark.parametrize("case", ["unanswered", "wrong", "correct"])
def test_validate_on_the_released_q05(case, tmp_path, reference, no_leftovers):
    answer = {"unanswered": None, "wrong": Q05_LATE_EXTRA, "correct": Path(reference["q05"]).read_text()}[case]
    out = validate(workspace(tmp_path / case, answer, reference))
    if case == "correct":
        assert "Success! Your notebook passes all the tests." in out
        return
    assert "VALIDATION FAILED ON 1 CELL(S)" in out and "Success" not in out
    assert 'require_check("q05")' in out and "CheckNotPassed: q05: the check did not pass." in out
    assert "grading.py" not in out and "Traceback" not in out      # no frame of the lab's (issue 41)
    if case == "unanswered":
        assert "q05 distribute_layers() is still the stub from the" in out
    else:
        assert "stage sizes [2, 2, 3]: the stages should differ by at most one" in out


def test_the_test_cell_fails_under_validate_only_and_says_why(monkeypatch, capsys):
    monkeypatch.setattr(grading, "_checked", {})
    monkeypatch.setenv("NBGRADER_EXECUTION", "validate")
    with pytest.raises(grading.CheckNotPassed, match="the check has not run in this kernel"):
        grading.require_check("q05")
    grading.record_check("q05", AssertionError("q05: stage sizes [2, 2, 3]"))
    with pytest.raises(grading.CheckNotPassed, match=r"did not pass.\nAssertionError: q05: stage sizes"):
        grading.require_check("q05")
    grading.record_check("q05", KeyboardInterrupt())
    with pytest.raises(grading.CheckNotPassed, match="interrupted"):
        grading.require_check("q05")
    grading.record_check("q05", None)
    grading.require_check("q05")
    assert "q05: the check passed" in capsys.readouterr().out
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")   # the grader's hidden tests decide, not this
    grading._checked.clear()
    grading.require_check("q05")
    assert grading.autograding() and not grading.validating()
    monkeypatch.delenv("NBGRADER_EXECUTION")                 # a student running the notebook: a note only
    grading.require_check("q05")
    assert "has not run" in capsys.readouterr().out
