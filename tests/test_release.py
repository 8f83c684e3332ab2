"""The student release (notebooks/) is generated from solutions/, matches it, and carries no answers."""
from __future__ import annotations

import filecmp
import json
import shutil

import pytest

from conftest import ROOT
from grader.answer_cells import cell_source
from grader.course import Course
from grader import plan
from lab_src.registry import ASSIGNMENT, EXERCISES, MODULES

RELEASE = ROOT / "notebooks"
SOURCE = ROOT / "solutions" / ASSIGNMENT


def released(ex):
    return RELEASE / ex.assignment / ex.notebook


def answer_lines(reference) -> set[str]:
    """Distinctive lines of every reference answer and model written answer (what must never ship)."""
    lines = set()
    for path in reference.values():
        for line in open(path).read().splitlines():
            s = line.strip()
            if len(s) > 25 and not s.startswith(("def ", "class ", '"""', "import ", "from ", "#")):   # the skeleton ships
                lines.add(s)
    for ex in EXERCISES.values():
        nb = json.loads((ROOT / "solutions" / ex.assignment / ex.notebook).read_text())
        for cell in nb["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if meta.get("solution") and cell["cell_type"] == "markdown":
                lines.update(s.strip() for s in cell_source(cell).splitlines() if len(s.strip()) > 30)
    return lines


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("release")
    for course in Course(tmp / "course", release=tmp / "release").each():
        course.generate_release()
    return tmp / "release"


def test_committed_release_is_exactly_what_nbgrader_generates(regenerated):
    assert sorted(p.name for p in regenerated.iterdir()) == sorted(p.name for p in RELEASE.iterdir()) == \
        sorted(m for m, qids in MODULES.items() if qids)
    for module in (p.name for p in regenerated.iterdir()):
        names = sorted(p.name for p in (regenerated / module).iterdir())
        assert names == sorted(p.name for p in (RELEASE / module).iterdir()) == \
            sorted(["README.md", *(EXERCISES[q].notebook for q in MODULES[module])])
        changed = [n for n in names if not filecmp.cmp(regenerated / module / n, RELEASE / module / n, shallow=False)]
        assert not changed, f"notebooks/{module} is stale: run `python -m grader release` and commit ({changed})"


def test_a_core_only_course_releases_the_ten_core_notebooks_with_their_index(tmp_path):
    plan.write(tmp_path / "course", ["pipeline_lab"], due={"pipeline_lab": "2026-10-09 23:59:00 UTC"})
    course = Course(tmp_path / "course", release=tmp_path / "release")
    assert [c.assignment for c in course.each()] == ["pipeline_lab"]
    course.generate_release()
    assert sorted(p.name for p in (tmp_path / "release").iterdir()) == ["pipeline_lab"]
    shipped = sorted(p.name for p in (tmp_path / "release" / "pipeline_lab").glob("*.ipynb"))
    assert shipped == sorted(EXERCISES[q].notebook for q in MODULES["pipeline_lab"]) and len(shipped) == 10
    index = (tmp_path / "release" / "pipeline_lab" / "README.md").read_text()
    core_total = sum(course.hidden_points()[q] for q in MODULES["pipeline_lab"] if EXERCISES[q].function)
    assert f"**{core_total:g}**" in index and "Due: 2026-10-09" in index and "Assignment 1 of 1" in index
    course.ensure_assignment()   # the gradebook knows the due date
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course.db_path}", "pipeline-lab") as gb:
        assert [a.name for a in gb.assignments] == ["pipeline_lab"]
        assert str(gb.find_assignment("pipeline_lab").duedate).startswith("2026-10-09 23:59")


def test_a_course_of_its_own_releases_into_its_folder_and_leaves_the_tracked_release_alone(tmp_path):
    """`python -m grader release` for a course.toml of one module (issue 41): its index says "Assignment 1 of 1",
    so it goes into the course's release/, never over the repository's notebooks/ (the default course's,
    tracked and compared with its source). A course.toml that says what the default says keeps notebooks/."""
    from grader import RELEASE
    tracked = (RELEASE / "tensor_parallel" / "README.md").read_text()
    plan.write(tmp_path / "tp", ["tensor_parallel"])
    course = Course(tmp_path / "tp")
    assert course.release == (tmp_path / "tp" / "release").resolve()
    path = course.generate_release()
    assert path == course.release / "tensor_parallel" and "Assignment 1 of 1" in (path / "README.md").read_text()
    plan.write(tmp_path / "all", [m for m in MODULES if MODULES[m]])
    assert Course(tmp_path / "all").release == RELEASE.resolve()          # what the default course says
    assert Course(tmp_path / "none").release == RELEASE.resolve()         # no course.toml: the default course
    plan.write(tmp_path / "due", [m for m in MODULES if MODULES[m]], due={"tensor_parallel": "2026-12-01 23:59:00 UTC"})
    assert Course(tmp_path / "due").release == (tmp_path / "due" / "release").resolve()
    assert (RELEASE / "tensor_parallel" / "README.md").read_text() == tracked


def test_a_course_toml_that_breaks_the_module_order_is_refused(tmp_path):
    with pytest.raises(plan.PlanError, match="q11 of pipeline_schedules builds on q02 of pipeline_lab"):
        plan.write(tmp_path, ["pipeline_schedules"])
    with pytest.raises(plan.PlanError, match="no module"):
        plan.write(tmp_path, ["pipeline_lab", "pipeline_labs"])


def test_release_holds_no_solution_and_no_hidden_test(reference):
    secret = answer_lines(reference)
    assert len(secret) > 40
    for path in RELEASE.glob("*/*.ipynb"):
        text = path.read_text()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "scored_out_of_process"):
            assert marker not in text, (path.name, marker)
        body = {ln.strip() for c in json.loads(text)["cells"] for ln in cell_source(c).splitlines()}
        leaked = secret & body
        assert not leaked, (path.name, sorted(leaked)[:3])


def test_every_release_answer_cell_is_a_stub_and_every_hidden_cell_is_kept():
    for ex in EXERCISES.values():
        nb = json.loads(released(ex).read_text())
        ids = {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}
        if ex.function:
            assert cell_source(ids[ex.answer_cell]).startswith(f"%%answer {ex.id}")
            assert "raise NotImplementedError()" in cell_source(ids[ex.answer_cell])
            assert ids[ex.hidden_cell]["metadata"]["nbgrader"]["points"] > 0


def test_each_graded_prediction_of_q19_to_q25_shows_its_form_before_anything_answers_it():
    """The prompt and the release's stub spell out the return with every key the grader reads (lab_src's records,
    which the hidden test and the check read too); no figure before the answer cell draws what q21, q23 or q24
    predicts."""
    from lab_src.judge.numeric import return_form
    from lab_src.topics.data_parallel import records as dp
    from lab_src.topics.experts import records as ex
    from lab_src.topics.long_sequences import records as ls
    from lab_src.topics.sharding import records as sh
    for qid, name, keys in [("q19", dp.PREDICTION_NAME, dp.PREDICTION_KEYS),
                            ("q20", dp.BUCKET_PREDICTION, dp.BUCKET_PREDICTION_KEYS),
                            ("q21", sh.PREDICTION_NAME, sh.PREDICTION_KEYS),
                            ("q22", sh.FSDP_PREDICTION, sh.FSDP_PREDICTION_KEYS),
                            ("q23", ls.PREDICTION_NAME, ls.PREDICTION_KEYS),
                            ("q24", ls.PREDICTION_Q24, ls.PREDICTION_Q24_KEYS),
                            ("q25", ex.PREDICTION_NAME, ex.PREDICTION_KEYS)]:
        form = return_form(keys).strip("`")
        cells = json.loads(released(EXERCISES[qid]).read_text())["cells"]
        at = next(i for i, c in enumerate(cells) if cell_source(c).startswith(f"%%answer {qid}"))
        stub = cell_source(cells[at])
        assert f"def {name}():" in stub and form in stub and "raise NotImplementedError()" in stub, (qid, stub)
        assert any(form in cell_source(c) for c in cells[:at] if c["cell_type"] == "markdown"), qid
        if qid == "q21":        # the ZeRO rows of the picture come after the prediction, the opening draws one row
            before = [cell_source(c) for c in cells[:at] if c["cell_type"] == "code"]
            assert any("zero_figure(n=4, stages=1)" in c for c in before)
            assert not any("zero_figure(n=4)" in c for c in before)
            assert any("zero_figure(n=4)" in cell_source(c) for c in cells[at:])
        if qid == "q23":        # the measured figure and the check come after the prediction; what runs before it
            before = [cell_source(c) for c in cells[:at] if c["cell_type"] == "code"]    # counts a small float32 block
            assert not any("kept_figure(report)" in c or "check(" in c for c in before)
            assert any("kept_figure(report)" in cell_source(c) for c in cells[at:])
            assert not any("bfloat16" in c or "256" in c for c in before)
        if qid == "q24":        # the opening figure draws the ring's tiles at N = 4 (the prediction asks N = 8); the
            before = [cell_source(c) for c in cells[:at] if c["cell_type"] == "code"]    # check and the run's after
            assert any("tiles_figure(4)" in c for c in before)
            assert not any("blocks_figure(report)" in c or "check(" in c for c in before)
            assert any("blocks_figure(report)" in cell_source(c) for c in cells[at:])
        if qid == "q25":        # the opening figure is the rule on random tokens; the check and its figure come after
            before = [cell_source(c) for c in cells[:at] if c["cell_type"] == "code"]
            assert any("example_figure()" in c for c in before)
            assert not any("traffic_figure(report)" in c or "check(" in c for c in before)


def test_running_a_source_notebook_leaves_nothing_that_would_ship(tmp_path, no_leftovers):
    """Instructors run the source notebooks; what that leaves (answers/, runs/) must not reach students."""
    import nbformat
    from nbclient import NotebookClient
    source = tmp_path / "solutions" / ASSIGNMENT
    shutil.copytree(SOURCE, source)
    for qid in ("q02", "q03", "q05"):  # q05's check builds on q02 and q03
        nb = nbformat.read(source / EXERCISES[qid].notebook, as_version=4)
        NotebookClient(nb, timeout=120, allow_errors=True, resources={"metadata": {"path": str(source)}}).execute()
        errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
        assert [e["ename"] for e in errors] == ["AwaitingGrader"], errors  # only the hidden-test cell fails here
    left = sorted(p.name for p in source.iterdir() if p.suffix != ".ipynb")
    assert "answers" in left and "runs" in left  # the runs did leave files ...
    Course(tmp_path / "course", release=tmp_path / "release", source=tmp_path / "solutions").generate_release()
    shipped = sorted(p.name for p in (tmp_path / "release" / ASSIGNMENT).iterdir())
    assert shipped == sorted(["README.md", *(EXERCISES[q].notebook for q in MODULES[ASSIGNMENT])])  # ... none of it ships
