"""The sample cohort (conftest.graded_cohort), autograded for real (nbgrader + the out-of-process hidden
tests), eight at a time: each student gets exactly what they deserve, cheaters and broken submissions included, nobody's
grading disturbs anybody else's, nothing hangs and no process survives."""
from __future__ import annotations

import json
import re
import sys
import zipfile
from html import unescape

import psutil
import pytest

from conftest import PARTIAL_COHORT, ROOT, lab_processes
from grader.autograde import grade_all
from grader.cli import main as grader_cli
from grader.cohort import BY_NAME, COHORT, golden
from grader.course import Course, hidden_points
from grader.feedback import generate_feedback
from grader.formgrader_view import describe, problems, submissions
from grader.report import grade_rows, progress
from lab_src.registry import EXERCISES, MODULES

# the first test to use conftest.graded_cohort grades the whole cohort in its setup: far more than the
# default per-test limit on a loaded 2-core machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

# graded one at a time as well, to compare with the concurrent run: a notebook nbgrader cannot read, and
# edited test cells (each changes what grading stages and runs)
SEQUENTIAL = ["sam", "quinn"]


@pytest.fixture(scope="module")
def cohort(graded_cohort):
    if PARTIAL_COHORT:
        pytest.skip(f"LAB_TEST_COHORT grades only {', '.join(PARTIAL_COHORT)}")
    return graded_cohort


def test_every_submission_was_graded(cohort):
    """Both halves, for everybody: the hidden tests, and nbgrader's autograde (eight students at a time on
    this machine's cores: nbgrader's kernels start under load, grader/execute.py)."""
    course, results, rows = cohort
    assert {s: (r["state"], r.get("error")) for s, r in results.items()} == {s.name: ("graded", None) for s in COHORT}
    assert {s: {a: o["nbgrader_exit"] for a, o in r["assignments"].items()} for s, r in results.items()} == \
        {s.name: dict.fromkeys(s.assignments(), 0) for s in COHORT}     # each assignment the student returned
    for one in course.each():
        assert progress(one)["graded"] == sorted(s.name for s in COHORT if one.assignment in s.assignments())
    assert not lab_processes(str(course.root)), "a torchrun process of the grading survived"
    print("kernel start retries:", {s: r["kernel_start_retries"] for s, r in results.items() if r["kernel_start_retries"]})


def test_nbgrader_shows_every_student_autograded_named_scored_and_with_feedback(cohort):
    """What the formgrader's Manage Submissions page lists, and the feedback of every notebook."""
    course, _, rows = cohort
    for one in course.each():    # each assignment with its own submissions
        assert generate_feedback(one) == {}
        assert problems(one) == {}
        shown = submissions(one)
        returned = [s for s in COHORT if one.assignment in s.assignments()]
        assert sorted(shown) == sorted(s.name for s in returned)
        for s in returned:
            sub = shown[s.name]
            assert sub["autograded"] and sub["first_name"] == s.name.capitalize() and sub["last_name"], sub
            assert sub["score"] == pytest.approx(rows[s.name][one.assignment])
        print(describe(one))


def test_a_notebook_that_is_not_json_costs_only_itself(cohort):
    """sam's q03 is cut off mid-file: the nine other notebooks are autograded with their feedback; q03
    scores 0 and its feedback names the file, the line and the column."""
    course, results, rows = cohort
    assert list(results["sam"]["unreadable"]) == ["q03_activation_shape.ipynb"]
    core = [EXERCISES[q].notebook for q in MODULES["pipeline_lab"]]
    assert sorted(p.name for p in course.autograded("sam").glob("*.ipynb")) == sorted(core)
    points = {q: p for q, p in hidden_points().items() if BY_NAME["sam"].returned(q)}     # the core's: all he returned
    assert {q: rows["sam"][q] for q in points} == {q: (0.0 if q == "q03" else points[q]) for q in points}
    grader_cli(["--course", str(course.root), "feedback", "--student", "sam"])
    html = (course.feedback("sam") / "q03_activation_shape.html").read_text()
    assert "The grader could not read this notebook" in html
    assert re.search(r"q03_activation_shape.ipynb is not valid JSON: [^<]*\(line \d+, column \d+;", html)
    assert len(list(course.feedback("sam").glob("*.html"))) == len(core)


@pytest.mark.parametrize("student", [s.name for s in COHORT])
def test_each_student_gets_exactly_what_they_deserve(cohort, student):
    _, _, rows = cohort
    points = hidden_points()
    got = {qid: rows[student].get(qid) for qid in points}
    want = BY_NAME[student].expected_points(points)
    assert got == pytest.approx(want), BY_NAME[student].story


def test_points_and_feedback_texts_are_as_recorded(cohort):
    """Every student's points and every text their feedback shows, exactly as grader/cohort/golden.py recorded
    them in tests/golden/cohort.json: a refactor changes none of them."""
    course, _, rows = cohort
    diff = golden.differences(golden.record(course, rows), golden.load())
    assert not diff, (f"{len(diff)} differences from {golden.GOLDEN.name} (if the change is meant, record it again "
                      f"with `{golden.HOW}`):\n" + "\n".join(diff[:30]))


def written_cells() -> int:
    """The answers an instructor grades by hand in the release: nbgrader cells that are both graded and
    a solution (ada answers every one)."""
    notebooks = (ROOT / "notebooks").glob("*/*.ipynb")
    return sum(1 for nb in notebooks for c in json.loads(nb.read_text())["cells"]
               if c.get("metadata", {}).get("nbgrader", {}).get("grade") and c["metadata"]["nbgrader"].get("solution"))


def test_written_answers_wait_for_the_instructor(cohort):
    _, _, rows = cohort
    assert rows["ada"]["written_pending"] == written_cells() == 10   # q01's four, q07, q08, q11, q16, q17, q18's one
    assert rows["untouched"]["written_pending"] == 0    # unanswered: nbgrader scores them 0 at once


def test_feedback_shows_verdicts_but_not_the_hidden_tests(cohort, capsys):
    course, _, _ = cohort
    assert grader_cli(["--course", str(course.root), "feedback", "--student", "ivo", "hana"]) == 0
    # written answers not graded by hand yet show as 0 in the feedback: the instructor is told (issue 41)
    said = " ".join(capsys.readouterr().out.split())
    assert "NOTE: 12 written answers of 2 of these submissions are not graded yet (hana 6, ivo 6)" in said, said
    ivo = " ".join((course.feedback("ivo") / "q08_afab_step.html").read_text().split())   # messages wrap
    # the lab's table and figure rules (nbgrader's page resets td padding: q17's f/g table ran together), once
    assert ivo.count('<style id="lab-feedback">') == 1 and "td, th {padding: 3px 12px" in ivo
    assert "Score 3.33 / 20" in ivo and "number of micro-batches" in ivo
    hana = " ".join((course.feedback("hana") / "q07_pipeline_communicate.html").read_text().split())
    assert "wrong peer" in hana and "gradients come back from the next stage" in hana
    for html in course.root.glob("feedback/*/*/*.html"):
        # the hidden tests' call, never shown (pia's own cell names the function: she patches it)
        text = unescape(re.sub(r"<[^>]+>", "", html.read_text()))
        assert 'scored_out_of_process("q' not in text and "HIDDEN TESTS" not in text, html


def test_feedback_names_the_p2p_and_1f1b_mistakes(cohort):
    course, _, _ = cohort
    assert grader_cli(["--course", str(course.root), "feedback", "--student", "wren", "yuki"]) == 0
    schedules = course.of("q11")     # the assignment pipeline_schedules

    def page(student, notebook):     # the page's text, as one line: messages wrap
        return " ".join((schedules.feedback(student) / notebook).read_text().split())
    wren_q11 = page("wren", "q11_p2p_communicate.html")
    assert "each wait inside a send to the other" in wren_q11 and "batch_isend_irecv" in wren_q11
    assert "The warm-up is off by +1" in page("wren", "q12_one_f_one_b_step.html")
    assert "does not require grad" in page("yuki", "q11_p2p_communicate.html")
    assert "never backward" in page("yuki", "q12_one_f_one_b_step.html")


@pytest.mark.q12
def test_autograded_q12_draws_the_graders_run_with_its_memory_lane(cohort):
    course, _, _ = cohort
    nb = json.loads((course.of("q12").autograded("ada") / "q12_one_f_one_b_step.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "report.timeline()" in "".join(c["source"]))
    assert any("image/png" in o.get("data", {}) for o in cell["outputs"])
    first = next(c for c in nb["cells"] if "schedule_figure(" in "".join(c["source"]))
    assert any("image/png" in o.get("data", {}) for o in first["outputs"])     # the schedules, drawn before any code


@pytest.mark.q08
def test_autograded_q08_draws_the_graders_run_as_a_static_figure(cohort):
    course, _, _ = cohort
    nb = json.loads((course.autograded("ada") / "q08_afab_step.ipynb").read_text())
    cell = next(c for c in nb["cells"] if "report.timeline()" in "".join(c["source"]))
    kinds = {k for o in cell["outputs"] for k in o.get("data", {})}
    assert "image/png" in kinds and "application/vnd.jupyter.widget-view+json" not in kinds


def test_output_of_a_loud_student_is_bounded(cohort):
    course, _, _ = cohort
    # nils prints megabytes from q05; what each autograded notebook keeps of its outputs, the lab's own
    # pictures aside (a timeline PNG is 200-250 KB and its size follows the measured times), is cut down
    def text_outputs(path) -> int:
        outputs = [o for c in json.loads(path.read_text())["cells"] for o in c.get("outputs", [])]
        return sum(len(json.dumps({**o, "data": {k: v for k, v in o.get("data", {}).items()
                                                 if not k.startswith("image/")}})) for o in outputs)
    sizes = {p.name: text_outputs(p) for one in course.each() for p in one.autograded("nils").glob("*.ipynb")}
    returned = [q for q in EXERCISES if BY_NAME["nils"].returned(q)]      # the core's ten
    assert len(sizes) == len(returned) and max(sizes.values()) < 100_000, sizes
    assert sizes["q05_distribute_layers.ipynb"] > 10_000         # his print is there, cut down, not dropped
    logs = list((course.root / "grader" / "nils" / "work" / "run").glob("rank*.log"))
    assert logs and max(p.stat().st_size for p in logs) < 400_000


def test_tampering_in_the_kernel_changes_nothing(cohort):
    """pia's patches made her hidden-test cells pass inside her kernel; the gradebook says zero anyway."""
    course, _, rows = cohort
    nb = json.loads((course.autograded("pia") / "q05_distribute_layers.ipynb").read_text())
    hidden = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "q05_hidden")
    assert "Score 0 / 10" in "".join(o.get("text", "") for o in hidden["outputs"])
    assert rows["pia"]["autograded"] == 0


@pytest.mark.uses_cohort_late
def test_one_at_a_time_gives_the_same_grades(request, tmp_path):
    """Graded while the cohort grades in the background (its own copies of the submissions, built as the
    cohort's are), then compared with the cohort's grades."""
    from grader.cli import collect_folder
    from grader.cohort import build_student
    if PARTIAL_COHORT:
        pytest.skip(f"LAB_TEST_COHORT grades only {', '.join(PARTIAL_COHORT)}")
    for s in SEQUENTIAL:
        build_student(BY_NAME[s], tmp_path / "submissions")
    alone = Course(tmp_path / "course")
    assert collect_folder(alone, tmp_path / "submissions") == sorted(SEQUENTIAL)
    for s in SEQUENTIAL:
        assert grade_all(alone, [s], jobs=1)[s]["state"] == "graded"
    alone_rows = {r["student"]: r for r in grade_rows(alone)}
    course, _, _ = request.getfixturevalue("cohort")
    rows = {r["student"]: r for r in grade_rows(course)}    # the core assignment's
    for s in SEQUENTIAL:
        assert alone_rows[s] == rows[s]


def test_zip_collect_export_and_status(cohort, tmp_path):
    course, _, _ = cohort
    archive = tmp_path / "returned.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for s in ("ada", "ivo"):
            for nb in course.submitted(s).glob("*.ipynb"):
                z.write(nb, f"{s}/{nb.name}")
    fresh = tmp_path / "course"
    assert grader_cli(["--course", str(fresh), "collect", "--assignment", "pipeline_lab", "--zip", str(archive)]) == 0
    assert sorted(p.name for p in (fresh / "submitted").iterdir()) == ["ada", "ivo"]
    assert len(list((fresh / "submitted" / "ivo" / "pipeline_lab").glob("*.ipynb"))) == len(MODULES["pipeline_lab"])
    out = tmp_path / "grades.csv"
    assert grader_cli(["--course", str(course.root), "export", "--to", str(out)]) == 0
    assert "ada" in out.read_text()
    detail = (tmp_path / "grades_by_exercise.csv").read_text().splitlines()
    # a column per assignment (its points), then one per exercise of it
    assert detail[0].startswith("student,pipeline_lab,q02,q03") and ",pipeline_schedules,q11,q12,q15," in detail[0]
    assert len(detail) == len(COHORT) + 1
    assert grader_cli(["--course", str(course.root), "status"]) == 0


def test_mallory_reached_nothing_outside_her_sandbox_and_left_nothing(cohort):
    """Her q06 answer looked for the reference, the baselines, the gradebook and the grader's files, tried
    to write into the installation, the network and the process limit, and left a process printing fake
    verdicts: she got exactly what fumi's mistake deserves (test above), and this is what she saw."""
    from lab_src.harness.sandbox import Limits
    course, _, _ = cohort
    logs = (course.root / "grader" / "mallory" / "work" / "run").glob("rank*.log")
    reports = [json.loads(line.split(" ", 1)[1]) for log in logs for line in log.read_text().splitlines()
               if line.startswith("MALLORY ")]
    assert reports, "her answer ran"
    for seen in reports:
        leaks = [p for p in seen["found"] if any(w in p for w in ("solutions", "gradebook", "cache", "baseline",
                                                                  "verdicts", ".ipynb", "needs_dataloader"))]
        assert leaks == [] and seen["wrote"] == [] and seen["net"] is False, seen
        assert 0 < seen["forks"] < Limits().processes
    left = [p.pid for p in own_sandboxed_processes(course.root)]
    assert left == [], "a sandboxed process outlived its grading"


def own_sandboxed_processes(root) -> list:
    """The processes of this course's sandboxes still running: a uid of the sandboxes' range that one of its
    folders maps to (sandbox.grading_uid), or a working directory inside it. Another course graded on the
    same machine at the same time has processes in the same range, and they are not this test's."""
    from lab_src.harness.sandbox import UIDS, grading_uid
    uids = {grading_uid(folder) for folder in root.rglob("*") if folder.is_dir()}
    mine = []
    for p in psutil.process_iter(["uids", "cwd"]):
        uid = p.info["uids"].real if p.info["uids"] else None
        if uid in UIDS and (uid in uids or str(p.info.get("cwd") or "").startswith(str(root))):
            mine.append(p)
    return mine


def test_nbgraders_kernel_ran_mallorys_cell_in_the_sandbox(cohort):
    """nbgrader's kernel executed her answer cell too (it defines the function in the notebook): from
    there as well she saw only her own notebook folder, wrote nothing, reached no network."""
    course, _, _ = cohort
    folder = course.autograded("mallory")
    nb = json.loads(next(folder.glob("q06_*.ipynb")).read_text())
    texts = ["".join(out.get("text", "")) for cell in nb["cells"] for out in cell.get("outputs", [])]
    reports = [json.loads(line.split(" ", 1)[1]) for text in texts for line in text.splitlines()
               if line.startswith("MALLORY ")]
    assert reports, "nbgrader's kernel ran her answer cell"
    for seen in reports:
        outside = [p for p in seen["found"] if not p.startswith((str(folder.resolve()), sys.prefix))]
        assert outside == [] and seen["wrote"] == [] and seen["net"] is False, seen
        assert 0 < seen["forks"] < 3000


def test_an_exit_in_one_answer_costs_only_that_exercise_and_names_the_rank(cohort):
    course, _, rows = cohort
    verdicts = json.loads((course.root / "grader" / "xena" / "verdicts.json").read_text())["exercises"]
    assert "called exit() on rank" in "\n".join(verdicts["q06"]["messages"])
    assert all(verdicts[q]["fraction"] == 1.0 for q in verdicts if q != "q06")
