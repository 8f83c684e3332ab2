"""nbgrader's formgrader on the graded sample cohort, in a real JupyterLab server driven by headless Chromium.

The course folder is the one tests/test_cohort.py grades (conftest.graded_cohort), with an exchange
folder of its own (grader/course.py, EXCHANGE). The test opens the formgrader's own pages, as an
instructor does from JupyterLab's Nbgrader menu: Manage Assignments (no exchange warning), Manage
Submissions (every student named, autograded, with a score) and Manual Grading of q01 (every student
listed), and sam's q03, the notebook that was not JSON. Screenshots go to out/screenshots/formgrader/.
JupyterLab (tests/test_timeline_browser.py's helpers) and the browser are stopped whatever happens.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from conftest import children_left

from grader.cohort import COHORT
from grader.cohort.roster import roster_rows
from grader.course import Course
from lab_src.registry import ASSIGNMENT
from test_timeline_browser import (CHROMIUM, CHROMIUM_ARGS, SHOTS, alive, describe, free_port, settle, start_lab,
                                   stop_lab, tagged, wait_http)

# the first test to use conftest.graded_cohort grades the whole cohort in its setup: far more than the
# default per-test limit on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

OUT = SHOTS / "formgrader"
ROWS = "table.dataTable tbody tr"


def open_table(page, url: str, rows: int) -> list[str]:
    """Open a formgrader page and wait until its table (filled by the page's JavaScript) has `rows` rows."""
    page.goto(url)
    page.wait_for_function(f"() => document.querySelectorAll('{ROWS}').length >= {rows}", timeout=60_000)
    return page.locator(ROWS).all_inner_texts()


def full_page_shot(page, name: str, saved: list) -> None:
    settle(page)
    path = OUT / name
    page.screenshot(path=str(path), full_page=True)
    saved.append(path)
    print(f"screenshot: {path}")


def drive(page, base: str, token: str, saved: list, students=COHORT) -> None:
    names = {r["id"]: f"{r['last_name']}, {r['first_name']}" for r in roster_rows(students)}
    page.goto(f"{base}/formgrader/manage_assignments?token={token}")   # logs the browser in
    page.wait_for_selector(ROWS, timeout=60_000)
    body = page.inner_text("body")
    assert "exchange directory" not in body and not page.locator("#warning-exchange").count(), body[:2000]
    full_page_shot(page, "manage_assignments.png", saved)

    rows = open_table(page, f"{base}/formgrader/manage_submissions/{ASSIGNMENT}", len(students))
    assert len(rows) == len(students)
    for student, name in names.items():
        row = next((r for r in rows if f"\t{student}\t" in r), None)
        assert row is not None, f"{student} is not listed: {rows}"
        assert row.startswith(name) and "needs autograding" not in row and " / " in row, row
    assert not [r for r in rows if r.startswith("None, None")]
    full_page_shot(page, "manage_submissions.png", saved)

    rows = open_table(page, f"{base}/formgrader/gradebook/{ASSIGNMENT}/q01_seeds", len(students))
    assert len(rows) == len(students)
    page.locator("#toggle_names").click()   # "Show All Names" instead of "Submission #n"
    shown = page.locator(ROWS).all_inner_texts()
    for name in names.values():
        assert any(name in r for r in shown), f"{name} is missing from Manual Grading of q01: {shown}"
    full_page_shot(page, "manual_grading_q01.png", saved)

    # sam's q03: the notebook that was not valid JSON, as the formgrader shows it
    rows = open_table(page, f"{base}/formgrader/gradebook/{ASSIGNMENT}/q03_activation_shape", len(students))
    page.locator("#toggle_names").click()
    sam = page.locator(ROWS).filter(has_text=names["sam"]).locator("a", has_text=names["sam"])
    sam.click()
    page.wait_for_selector("text=The grader could not read this notebook", timeout=60_000)
    assert "is not valid JSON" in page.inner_text("body")
    full_page_shot(page, "sam_q03_not_json.png", saved)


def test_formgrader_shows_every_student(graded_cohort, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (scripts/system_deps.sh installs Debian's chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    course = Course(graded_cohort[0].root, exchange=graded_cohort[0].root / "exchange")
    course.write_config()
    OUT.mkdir(parents=True, exist_ok=True)
    port, token, tag = free_port(), uuid.uuid4().hex, uuid.uuid4().hex
    base = f"http://127.0.0.1:{port}"
    lab = start_lab(course.root, tmp_path / "home", port, token, tag)
    saved: list = []
    try:
        wait_http(f"{base}/api/status?token={token}", lab, tmp_path / "home" / "jupyterlab.log")
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            try:
                drive(page, base, token, saved, [s for s in COHORT if ASSIGNMENT in s.assignments()])
            except Exception:
                page.screenshot(path=str(OUT / "failure.png"), full_page=True)
                print(f"screenshot of the failure: {OUT / 'failure.png'}")
                raise
            finally:
                browser.close()
    finally:
        stop_lab(lab, base, token, tag)
    left = describe(alive(tagged(tag)))
    assert not left, f"processes of the test left behind: {left}"
    children = children_left(timeout=5)
    assert not children, f"child processes left behind: {describe(children)}"
    assert len(saved) == 4 and all(p.stat().st_size > 10_000 for p in saved)
    print(f"formgrader pages checked at {time.strftime('%H:%M:%S')}")
