"""End to end: the feedback a student gets for a failed q07 and a failed q08, looked at in Chromium.

One submission (the reference answers, with q07 receiving gradients from the wrong neighbour and q08
forgetting `requires_grad_()` on received activations) is autograded for real and its feedback
generated with `python -m grader feedback`. Each HTML page must show the grader's messages in the order
the visible checks use (the cause first, what it caused after, under its heading), no path into torch
or gloo, and the timeline figure of the grader's own run of the answer, with where each rank was left
waiting. Headless Chromium opens both pages and saves screenshots under out/screenshots/.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import children_left

from grader.cohort.answers import answer
from grader.cohort.students import Student
from lab_src.judge.summary import CONSEQUENCES

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHOTS = ROOT / "out" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]

# the reference step, without requires_grad_() on the activations a stage receives
Q08_NO_REQUIRES_GRAD = answer("q08_no_requires_grad")

STUDENT = Student("wanda", "q07 receives gradients from the wrong neighbour; q08 forgets requires_grad_()",
                  answers={"q07": answer("q07_deadlock"), "q08": Q08_NO_REQUIRES_GRAD},
                  # q07 as hana; q08 right only with one stage, which receives nothing (1 of 6 pipelines)
                  expect={"q07": 0.25, "q08": 0.1667})

IMAGES_DECODED = """async () => {
  await document.fonts.ready;
  await Promise.all([...document.images].map(img => img.decode().catch(() => null)));
  return [...document.images].filter(img => img.naturalWidth > 0).length;
}"""


@pytest.fixture(scope="module")
def feedback(tmp_path_factory):
    from grader.autograde import grade_all
    from grader.cli import collect_folder
    from grader.cli import main as grader_cli
    from grader.cohort.build import build_cohort
    from grader.course import Course, hidden_points
    from grader.report import grade_rows
    base = tmp_path_factory.mktemp("feedback")
    build_cohort(base / "submissions", [STUDENT])
    course = Course(base / "course")
    collect_folder(course, base / "submissions")
    assert grade_all(course, [STUDENT.name])[STUDENT.name]["state"] == "graded"
    row = next(r for r in grade_rows(course) if r["student"] == STUDENT.name)
    points = {q: p for q, p in hidden_points().items() if q in {e.id for e in course.exercises}}   # the core's
    assert {q: row[q] for q in points} == pytest.approx(STUDENT.expected_points(points))
    assert grader_cli(["--course", str(course.root), "feedback", "--student", STUDENT.name]) == 0
    return course.feedback(STUDENT.name)


def text_of(html: str) -> str:
    """The page's text, every run of white space one space (long messages wrap)."""
    import html as entities
    return " ".join(entities.unescape(re.sub(r"<[^>]+>", "", html)).split())


@pytest.mark.parametrize("notebook, cause, caused", [
    pytest.param("q07_pipeline_communicate.html",
                 "wrong peer: in recv_backward, gradients come back from the next stage",
                 "rank 0 waited in recv_backward(mb=0) from rank 1, itself waiting on the wrong peer",
                 marks=pytest.mark.q07),
    pytest.param("q08_afab_step.html", "the activation this stage received does not require grad",
                 "which had stopped with the error above", marks=pytest.mark.q08),
])
def test_feedback_orders_the_messages_and_draws_the_graders_failing_run(feedback, notebook, cause, caused):
    html = (feedback / notebook).read_text()
    text = text_of(html)
    hidden = text[text.index("Score "):]                 # the hidden-test cell's verdict
    assert hidden.index(cause) < hidden.index(CONSEQUENCES) < hidden.index(caused), hidden[:3000]
    assert "gloo" not in text and "/torch/" not in text and "site-packages" not in text
    check_cell = text[text.index("The timeline below is the grader's run"):]
    assert "which went wrong:" in check_cell and check_cell.index(cause) < check_cell.index(CONSEQUENCES)
    assert html.count("data:image/png;base64,") >= 1           # the timeline figure of the grader's run


def test_feedback_pages_in_chromium(feedback):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (scripts/system_deps.sh installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    SHOTS.mkdir(parents=True, exist_ok=True)
    saved = []
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            for notebook, name in (("q07_pipeline_communicate.html", "feedback_q07_failed.png"),
                                   ("q08_afab_step.html", "feedback_q08_failed.png")):
                page.goto((feedback / notebook).as_uri())
                assert page.evaluate(IMAGES_DECODED) >= 1
                # from the check's heading to the end: the grader's messages, its run, the score
                top = page.locator("h2", has_text="Check").last.bounding_box()["y"]
                height = page.evaluate("() => document.documentElement.scrollHeight")
                path = SHOTS / name
                page.screenshot(path=str(path), full_page=True,
                                clip={"x": 0, "y": top - 10, "width": 1200, "height": height - top + 10})
                saved.append(path)
                print(f"screenshot: {path}")
        finally:
            browser.close()
    assert all(p.stat().st_size > 20_000 for p in saved)
    children = children_left(timeout=5)
    assert not children, f"child processes left behind: {children}"
