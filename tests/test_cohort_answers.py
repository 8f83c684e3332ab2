"""The sample cohort's answers (grader/cohort/mistakes.py, grader/cohort/answers/) build as declared from today's
reference answers, without running any of them: a reference answer changed where a mistake edits it fails
here, in a second, rather than in the cohort's grading (tests/test_cohort.py, minutes)."""
from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from conftest import ROOT
from grader.cohort.answers import FOLDER, answer, names
from grader.cohort.mistakes import MISTAKES, EditDoesNotApply, Span, replaced
from grader.reference import reference_text, reference_texts


def test_every_answer_builds():
    files = {p.stem for p in FOLDER.glob("*.py") if not p.name.startswith("_")}
    assert not files & set(MISTAKES), "declared twice, as an edit and as a whole file"
    for name in names():
        text = answer(name)
        ast.parse(text, name)           # parsed only: the answers are never imported or run here
        assert text.endswith("\n"), name
    for name, mistake in MISTAKES.items():
        start = answer(mistake.base) if mistake.base else reference_text(mistake.qid)
        assert answer(name) != start, f"{name} changes nothing"


def test_unknown_answer():
    with pytest.raises(KeyError):
        answer("q99_nothing")
    with pytest.raises(KeyError):
        answer("__init__")


@pytest.mark.parametrize("edits, why", [
    ([("absent", "x")], "occurs 0 times"),
    ([("ab", "x")], "occurs 2 times"),
    ([("", "x")], "occurs everywhere"),
    ([("cab", "x"), ("abc", "y")], "overlap"),
    ([(Span("cab", "abc"), "x")], "comes before"),
])
def test_an_edit_that_does_not_apply_fails(edits, why):
    with pytest.raises(EditDoesNotApply, match=why):
        replaced("abcab", edits, "test")


def test_edits_are_made_at_once():
    assert replaced("one two three", [("three", "3"), ("one", "1"), (Span("tw", "o "), "2 ")], "test") == "1 2 3"


def test_reference_text_is_the_notebooks_answer():
    """reference_text (plain JSON, no cache folder) reads what the graders' reference_texts reads."""
    texts = reference_texts()
    assert {q: reference_text(q) for q in texts} == texts


def test_building_the_answers_imports_no_torch():
    code = ("import sys; from grader.cohort.answers import answer, names; [answer(n) for n in names()]; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
