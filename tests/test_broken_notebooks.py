"""A notebook nbgrader cannot read costs only itself: not valid JSON, not a notebook, or cells that lost
their metadata. nbgrader itself gives up on the student's whole assignment for any of them (shown here);
the grader has it autograde a copy in which each such notebook is the release's, opened by a note
naming the file and what is wrong (grader/staging.py), so the other notebooks get autograded and
feedback. The cohort's `sam` (q03 cut off mid-file) goes through the whole grader in test_cohort.py."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grader.answer_cells import NotebookUnreadable, notebook_problem, read_notebook, write_answer_files
from grader.cli import collect_folder
from grader.cohort import BY_NAME, build_student
from grader.course import Course
from grader.staging import stage_submission, staged
from lab_src.registry import ASSIGNMENT, EXERCISES, MODULES

CORE = [EXERCISES[q] for q in MODULES[ASSIGNMENT]]   # the assignment graded here


def cut_off(path: Path) -> None:
    path.write_text(path.read_text()[:500])


def not_a_notebook(path: Path) -> None:
    path.write_text(json.dumps(["my", "answers", "are", "elsewhere"]))


def lost_metadata(path: Path) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        cell.pop("metadata", None)
    path.write_text(json.dumps(nb))


BREAKAGES = {"q03": cut_off, "q04": not_a_notebook, "q06": lost_metadata}


@pytest.fixture
def broken(tmp_path):
    """ada's submission with q03 cut off, q04 not a notebook and q06's cells without metadata."""
    folder = build_student(BY_NAME["ada"], tmp_path / "returned")
    for qid, breakage in BREAKAGES.items():
        breakage(folder / EXERCISES[qid].notebook)
    course = Course(tmp_path / "course")
    collect_folder(course, tmp_path / "returned")
    return course


def test_each_problem_is_named_with_its_file_and_where(broken):
    sub = broken.submitted("ada")
    json_problem = notebook_problem(sub / EXERCISES["q03"].notebook)
    assert json_problem.startswith("q03_activation_shape.ipynb is not valid JSON: ")
    assert re.search(r"\(line \d+, column \d+;", json_problem), json_problem
    assert "is not a Jupyter notebook" in notebook_problem(sub / EXERCISES["q04"].notebook)
    assert "missing an expected key: metadata" in notebook_problem(sub / EXERCISES["q06"].notebook)
    assert notebook_problem(sub / EXERCISES["q05"].notebook) is None
    with pytest.raises(NotebookUnreadable, match="not valid JSON"):
        read_notebook(sub / EXERCISES["q03"].notebook)


def test_the_hidden_tests_give_zero_for_exactly_the_broken_notebooks(broken, tmp_path):
    paths = write_answer_files(broken.submitted("ada"), tmp_path / "answers")
    # the later assignments' notebooks are not in this folder: only the core's count here
    assert {q for q, p in paths.items() if p is None and q in MODULES[ASSIGNMENT]} == set(BREAKAGES)
    assert "(line " in write_answer_files.reasons["q03"]


def test_nbgrader_grades_a_copy_with_each_broken_notebook_replaced_by_a_note(broken):
    original = {p.name: p.read_bytes() for p in broken.submitted("ada").iterdir()}
    problems = stage_submission(broken, "ada")
    assert sorted(problems) == sorted(EXERCISES[q].notebook for q in BREAKAGES)
    for qid in BREAKAGES:
        nb = json.loads((staged(broken, "ada") / EXERCISES[qid].notebook).read_text())
        assert notebook_problem(staged(broken, "ada") / EXERCISES[qid].notebook) is None
        note = nb["cells"][0]["source"]
        assert note.startswith("**The grader could not read this notebook") and problems[EXERCISES[qid].notebook] in note
    for qid in {e.id for e in CORE} - set(BREAKAGES):
        name = EXERCISES[qid].notebook
        assert (staged(broken, "ada") / name).read_bytes() == original[name]
    assert {p.name: p.read_bytes() for p in broken.submitted("ada").iterdir()} == original, "submitted/ changed"


@pytest.mark.slow
def test_nbgrader_autogrades_the_rest_and_writes_feedback_for_every_notebook(broken):
    """nbgrader's own half: on the submission as returned it gives up on everything; on the staged
    copy it autogrades all ten notebooks, and feedback names the broken files."""
    broken.ensure_assignment()
    raw = broken.nbgrader("autograde", ASSIGNMENT, "--student", "ada", "--force", check=False)
    assert raw.returncode != 0 and not broken.autograded("ada").exists()
    problems = stage_submission(broken, "ada")
    proc = broken.nbgrader("autograde", ASSIGNMENT, "--student", "ada", "--force",
                           "--CourseDirectory.submitted_directory=grader", check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in broken.autograded("ada").glob("*.ipynb")) == sorted(e.notebook for e in CORE)
    broken.nbgrader("generate_feedback", ASSIGNMENT, "--force", "--student", "ada")
    feedback = {p.stem: p.read_text() for p in broken.feedback("ada").glob("*.html")}
    assert sorted(feedback) == sorted(Path(e.notebook).stem for e in CORE)
    for qid in BREAKAGES:
        html = feedback[Path(EXERCISES[qid].notebook).stem]
        assert "The grader could not read this notebook" in html
        assert EXERCISES[qid].notebook in html and problems[EXERCISES[qid].notebook].split(": ", 1)[1][:30] in html
