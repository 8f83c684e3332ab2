"""One registry: an exercise declared once in lab_src/registry.py, and everything else derived from it.
Also the layout rules that keep the parts apart: the student-facing top of lab_src, grader modules that
never import the visible checks, source notebooks with their jupytext twins in sync."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import lab_src
from lab_src.exercises import API
from lab_src.registry import CODED, EXERCISES, notebook_pattern

ROOT = Path(__file__).resolve().parents[1]


def test_api_and_all_follow_the_registry():
    assert set(API) == {e.id for e in CODED}
    for ex in CODED:
        assert getattr(lab_src, ex.function) is API[ex.id] and ex.function in lab_src.__all__


def test_every_exercise_belongs_to_one_module_and_needs_only_earlier_modules():
    from lab_src.registry import MODULES, module_order_problems
    listed = [q for qids in MODULES.values() for q in qids]
    assert sorted(listed) == sorted(EXERCISES) and len(set(listed)) == len(listed)
    assert module_order_problems() == []
    assert EXERCISES["q13"].assignment == "pipeline_training" and EXERCISES["q08"].assignment == "pipeline_lab"


def test_every_exercise_has_its_files_named_by_its_module():
    for ex in EXERCISES.values():
        assert (ROOT / "solutions" / ex.assignment / ex.notebook).exists()
        assert (ROOT / "notebooks" / ex.assignment / ex.notebook).exists()
        assert (ROOT / "lab_src" / "checks" / f"{ex.module}.py").exists()
        if ex.function:
            assert (ROOT / "grader" / "hidden" / f"{ex.module}.py").exists()


def test_a_missing_hidden_test_module_fails_loudly(monkeypatch):
    from grader import hidden
    from lab_src import registry
    fake = registry.Exercise("q99", "nothing_here", "a missing exercise", ())
    monkeypatch.setitem(registry.EXERCISES, "q99", fake)
    with pytest.raises(RuntimeError, match=r"q99 has no hidden tests: grader/hidden/q99_nothing_here.py is missing"):
        hidden.hidden_tests("q99")


def test_zip_collect_takes_exactly_the_exercises_notebooks():
    import re
    rx = re.compile(notebook_pattern())
    assert all(rx.fullmatch(ex.notebook) for ex in EXERCISES.values())
    assert not rx.fullmatch("q99_other.ipynb") and not rx.fullmatch("q08_afab_step.ipynb.bak")


def test_pytest_markers_select_what_concerns_an_exercise():
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "q05", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    picked = [line for line in out.splitlines() if "::" in line]
    from grader.cohort import COHORT
    students = {f"[{s.name}]" for s in COHORT if "q05" in s.expect}    # the cohort students whose story is q05's
    assert picked and all("q05" in t or "distribute_layers" in t or any(s in t for s in students)
                          for t in picked), picked


def test_readme_table_is_written_from_the_registry():
    from grader.readme import current, section
    assert current() == section(), "run `python -m grader readme`"


def test_source_notebooks_and_their_text_twins_agree():
    from grader.notebook_text import out_of_sync, pairs
    assert len(pairs()) == len(EXERCISES)
    assert out_of_sync() == [], "run `python -m grader text` (or `--from-py` after editing the .py files)"


def test_rebuilding_the_notebooks_from_unchanged_twins_changes_nothing(tmp_path):
    """`grader text --from-py` on twins nobody edited leaves every notebook as it is, byte for byte (a
    notebook stored in another layout, its nbgrader metadata in another key order, came back rewritten
    and out of sync with its own twin)."""
    import shutil

    from grader import SOURCE
    from grader.notebook_text import out_of_sync, write_notebooks
    copy = tmp_path / "solutions"
    shutil.copytree(SOURCE, copy)
    assert [p.name for p in write_notebooks(copy)] == []
    assert out_of_sync(copy) == []


def test_lab_src_top_level_holds_only_what_students_touch():
    top = sorted(p.name for p in (ROOT / "lab_src").iterdir() if not p.name.startswith("__pycache__"))
    assert top == ["__init__.py", "answers.py", "checks", "comm", "exercises.py", "grading.py", "harness", "judge",
                   "magic.py", "pipeline", "registry.py", "topics", "views"]


def test_no_grader_module_imports_the_visible_checks():
    for path in (ROOT / "grader").rglob("*.py"):
        if "cohort" in path.parts:      # the cohort's students patch lab_src.checks inside notebook text
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            assert not any(n == "lab_src.checks" or n.startswith("lab_src.checks.") for n in names), path


def repository_copy(tmp_path: Path):
    """A copy of the repository's files (tracked and not ignored) in tmp_path/repo, and a function that runs
    Python there: run(*args) -> the finished process."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.decode().split("\0")
    copy = tmp_path / "repo"
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (copy / f).parent.mkdir(parents=True, exist_ok=True)
            (copy / f).write_bytes((ROOT / f).read_bytes())
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "PYTHONPATH": str(copy)}
    return copy, lambda *args: subprocess.run([sys.executable, "-P", *args], cwd=copy, capture_output=True,
                                              text=True, timeout=600, env=env)


@pytest.mark.slow
def test_grader_new_writes_a_working_skeleton_in_at_most_seven_files(tmp_path):
    """In a copy of the repository: `python -m grader new` and nothing else gives an exercise that the
    API, the hidden-test lookup, the checks, the README table and the release all know."""
    copy, run = repository_copy(tmp_path)
    made = run("-m", "grader", "new", "q99", "p2p_exchange", "--title", "Raw P2P", "--points", "8")
    assert made.returncode == 0, made.stderr
    written = [line.split(" ", 1)[1] for line in made.stdout.splitlines() if line.startswith("wrote ")]
    assert len(written) <= 7, written
    probe = run("-c", "import lab_src, json\n"
                "from grader.hidden import hidden_tests\nfrom grader.readme import table\n"
                "from lab_src.checks import check\nimport importlib\n"
                "importlib.import_module('lab_src.checks.q99_p2p_exchange')\n"
                "print(json.dumps({'api': 'p2p_exchange' in lab_src.__all__, 'hidden': hidden_tests('q99').__name__,"
                "'readme': 'q99_p2p_exchange.ipynb' in table() and '| 8 |' in table()}))")
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.splitlines()[-1]) == {"api": True, "hidden": "grader.hidden.q99_p2p_exchange",
                                                          "readme": True}
    release = run("-m", "grader", "--course", str(tmp_path / "course"), "release")
    assert release.returncode == 0, release.stderr
    released = json.loads((copy / "notebooks" / "pipeline_lab" / "q99_p2p_exchange.ipynb").read_text())
    text = json.dumps(released)
    assert "raise NotImplementedError" in text and "BEGIN SOLUTION" not in text and "BEGIN HIDDEN" not in text
    assert not list((copy / "notebooks" / "pipeline_lab").glob("*.py")), "the jupytext twins must not ship"



@pytest.mark.slow
def test_grader_new_creates_a_module_with_its_title(tmp_path):
    """In a copy of the repository: `grader new q99 ... --module toy_module --module-title T` adds the module
    to MODULES (last, holding q99) and its title to MODULE_TITLES in lab_src/registry.py; its assignment is
    released with that title; an unknown module without a title, and a title for an existing one, are refused."""
    copy, run = repository_copy(tmp_path)
    refused = run("-m", "grader", "new", "q99", "toy_sum", "--module", "toy_module")
    assert refused.returncode != 0 and "give --module-title to create it" in refused.stderr
    refused = run("-m", "grader", "new", "q99", "toy_sum", "--module", "sharding", "--module-title", "Again")
    assert refused.returncode != 0 and "the module 'sharding' exists" in refused.stderr
    made = run("-m", "grader", "new", "q99", "toy_sum", "--title", "Toy", "--module", "toy_module",
               "--module-title", "A toy module: one exercise")
    assert made.returncode == 0, made.stderr
    assert (copy / "solutions" / "toy_module" / "q99_toy_sum.ipynb").exists()
    probe = run("-c", "import json\nfrom lab_src.registry import MODULES, MODULE_TITLES, module_order_problems\n"
                "print(json.dumps([list(MODULES)[-1], MODULES['toy_module'], MODULE_TITLES['toy_module'],"
                "list(MODULES) == list(MODULE_TITLES), module_order_problems()]))")
    assert probe.returncode == 0, probe.stderr
    assert json.loads(probe.stdout.splitlines()[-1]) == ["toy_module", ["q99"], "A toy module: one exercise", True, []]
    release = run("-m", "grader", "--course", str(tmp_path / "course"), "release", "--assignment", "toy_module")
    assert release.returncode == 0, release.stderr
    index = (copy / "notebooks" / "toy_module" / "README.md").read_text()
    assert index.startswith("# toy_module: A toy module: one exercise\n"), index[:200]


def test_every_module_has_a_title_beside_it():
    from lab_src.registry import MODULE_TITLES, MODULES
    assert list(MODULE_TITLES) == list(MODULES) and all(MODULE_TITLES.values())

# In the copy, after `grader new q99 toy_step --schedule afab`: the visible check without an answer, then with
# q08's reference step as the answer, then the hidden tests of that answer (without the sandbox: a test needs
# no bubblewrap), each printed as one JSON line.
TOY_STEP_PROBE = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, "tests")
from grader.reference import reference_sources
from hidden_grading import grade_answer
from lab_src.checks import check
from lab_src.registry import exercise

ref = reference_sources()
mapping = Path("answers.json")
os.environ["LAB_ANSWERS"] = str(mapping.resolve())
mapping.write_text(json.dumps({**ref, "q99": None}))
stub = check("q99")
answer = Path("q99_toy_step.py")
answer.write_text(Path(ref["q08"]).read_text().replace("def afab_step(", "def toy_step("))
mapping.write_text(json.dumps({**ref, "q99": str(answer.resolve())}))
report = check("q99")
hidden = grade_answer("q99", answer.read_text(), ref, Path("graded"), sandboxed=False)
ex = exercise("q99")
from grader.hidden import hidden_tests
from grader.hidden.common import Context
perturbed = [bool(c.settings.get("perturb")) for c in hidden_tests("q99").cases(Context(student={"q99": str(answer)},
                                                                                         reference=ref))]
print(json.dumps({"stub": [p.message for p in stub.problems], "ok": report.ok, "lines": report.lines,
                  "hidden": [hidden["fraction"], hidden["passed"], hidden["total"]],
                  "declared": [ex.schedule, ex.step_exercise, list(ex.needs)], "perturbed": perturbed}))
"""


@pytest.mark.slow
def test_grader_new_writes_a_schedule_exercise_whose_check_and_hidden_tests_run(tmp_path):
    """In a copy of the repository: `grader new --schedule afab` gives a step exercise whose visible check is
    the pipeline check (it says the answer is missing, then passes q08's reference step) and whose hidden
    tests are the pipeline items on every grading configuration (the reference step gets every point)."""
    copy, run = repository_copy(tmp_path)
    made = run("-m", "grader", "new", "q99", "toy_step", "--title", "Toy AFAB", "--schedule", "afab")
    assert made.returncode == 0, made.stderr
    written = [line.split(" ", 1)[1] for line in made.stdout.splitlines() if line.startswith("wrote ")]
    assert len(written) <= 7, written
    assert "pipeline_check(" in (copy / "lab_src" / "checks" / "q99_toy_step.py").read_text()
    hidden_text = (copy / "grader" / "hidden" / "q99_toy_step.py").read_text()
    assert "pipeline_cases(" in hidden_text and "pipeline_item(" in hidden_text, "q08's case builder and judge"
    refused = run("-m", "grader", "new", "q98", "toy_step", "--schedule", "no_such_schedule")
    assert refused.returncode != 0 and "no schedule 'no_such_schedule'" in refused.stderr
    probe = run("-c", TOY_STEP_PROBE)
    assert probe.returncode == 0, probe.stderr[-3000:]
    got = json.loads(probe.stdout.splitlines()[-1])
    assert got["stub"] == ["q99 toy_step() has no answer yet: open q99_toy_step.ipynb, write the function in its "
                           "answer cell (the one starting with %%answer q99) and run that cell."]
    assert got["ok"], "\n".join(got["lines"])
    assert sum("match the unsharded baseline" in line for line in got["lines"]) == 2
    assert got["hidden"] == [1.0, 6, 6]
    assert got["declared"] == ["afab", "q99", ["q02", "q03", "q04", "q05", "q06", "q07"]]
    assert got["perturbed"] == [False, True, True, True, True, True], "q08's perturbed cases (pipeline_cases)"


# In the copy, after `grader new q99 toy_sum --topic toy`: the topic's kind in the core's tables, the visible
# check and the hidden tests of an answer that returns 3, each printed as one JSON line.
TOY_TOPIC_PROBE = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, "tests")
from grader.reference import reference_sources
from hidden_grading import grade_answer
from lab_src.checks import check
from lab_src.harness.kinds import KINDS
from lab_src.harness.observed import record_class

ref = reference_sources()
answer = Path("q99_toy_sum.py")
answer.write_text("def toy_sum():\\n    return 3\\n")
mapping = Path("answers.json")
mapping.write_text(json.dumps({**ref, "q99": str(answer.resolve())}))
os.environ["LAB_ANSWERS"] = str(mapping.resolve())
report = check("q99")
hidden = grade_answer("q99", answer.read_text(), ref, Path("graded"), sandboxed=False)
print(json.dumps({"kind": KINDS["toy"].module, "record": record_class("toy").__name__, "ok": report.ok,
                  "lines": report.lines, "hidden": [hidden["fraction"], hidden["passed"], hidden["total"]]}))
"""


@pytest.mark.slow
def test_grader_new_writes_a_topic_that_the_core_reads_without_a_core_table_changed(tmp_path):
    """`grader new q99 toy_sum --topic toy`: one new folder, lab_src/topics/toy/, and of the core only the
    registry's entry and the contract; the kinds table, the records, the visible check and the hidden tests
    know the topic's kind, and the layout's rules (tests/test_topics.py) hold in the copy."""
    copy, run = repository_copy(tmp_path)
    made = run("-m", "grader", "new", "q99", "toy_sum", "--title", "Toy", "--topic", "toy")
    assert made.returncode == 0, made.stderr
    written = sorted(Path(line.split(" ", 1)[1]).relative_to(copy).as_posix() for line in made.stdout.splitlines()
                     if line.startswith("wrote "))
    assert written == ["grader/hidden/q99_toy_sum.py", "lab_src/checks/q99_toy_sum.py", "lab_src/exercises.py",
                       "lab_src/registry.py", "lab_src/topics/toy/__init__.py", "lab_src/topics/toy/judge.py",
                       "lab_src/topics/toy/kind.py", "lab_src/topics/toy/records.py",
                       "solutions/pipeline_lab/q99_toy_sum.ipynb", "solutions/pipeline_lab/q99_toy_sum.py"], written
    probe = run("-c", TOY_TOPIC_PROBE)
    assert probe.returncode == 0, probe.stderr[-3000:]
    got = json.loads(probe.stdout.splitlines()[-1])
    assert got["kind"] == "lab_src.topics.toy.kind" and got["record"] == "ToyObserved"
    assert got["ok"], "\n".join(got["lines"])
    assert got["hidden"] == [1.0, 2, 2]
    rules = run("-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_topics.py")
    assert rules.returncode == 0, rules.stdout[-3000:]


def _function_ast(text: str, name: str) -> str:
    return next(ast.dump(node) for node in ast.parse(text).body if isinstance(node, ast.FunctionDef) and node.name == name)


def test_grader_new_schedule_template_checks_and_grades_as_q08_does(tmp_path):
    """The `--schedule` templates, written for q08 itself, against q08's own files: the hidden tests build the
    same cases (common.pipeline_cases: every case of 2 stages or more has rank 0 change its embedding by an
    amount the answer cannot know, evidence from outside the answer) and judge them with the same helper
    (common.pipeline_item); the visible check is the same pipeline check on the same configurations. A
    template that builds its own cases (`ctx.case(...)` without the perturbation) grades a new step weaker
    than q08 is graded, and fails here."""
    import importlib.util

    from grader import new_exercise
    from grader.hidden import hidden_tests
    from grader.hidden.common import Context
    names = dict(qid="q08", function="afab_step", schedule="afab")
    written = tmp_path / "q08_from_template.py"
    written.write_text(new_exercise.STEP_HIDDEN_TESTS.format(**names))
    spec = importlib.util.spec_from_file_location("grader.hidden.q08_from_template", written)
    made = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(made)
    q08 = hidden_tests("q08")
    ctx = Context(student={"q08": str(tmp_path / "q08_answer.py")},
                  reference={e.id: str(tmp_path / f"reference_{e.id}.py") for e in CODED})
    got, want = made.cases(ctx), q08.cases(ctx)
    assert [c.to_dict() for c in got] == [c.to_dict() for c in want]
    several = [c for c in got if c.config.num_stages > 1]
    assert several and all(c.kind == "pipeline" and c.settings.get("perturb") for c in several), \
        "every case of 2 stages or more perturbs stage 0's embedding, as q08's do"
    assert _function_ast(written.read_text(), "judge") == \
        _function_ast((ROOT / "grader" / "hidden" / "q08_afab_step.py").read_text(), "judge")
    assert _function_ast(new_exercise.STEP_CHECK.format(**names), "check") == \
        _function_ast((ROOT / "lab_src" / "checks" / "q08_afab_step.py").read_text(), "check")
