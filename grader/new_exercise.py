"""`python -m grader new qNN function_name [--schedule NAME] [--module M [--module-title "..."]]`: the skeleton
of a new exercise, in every place it needs one.

Writes (never overwriting an existing file):
    solutions/<module>/qNN_<function>.ipynb and its .py twin   prose, answer cell, check, hidden-test cell
    lab_src/checks/qNN_<function>.py                           the visible check
    grader/hidden/qNN_<function>.py                            the hidden tests
and adds the exercise's declaration to lab_src/registry.py (its entry, and its id in its module's tuple of
`MODULES`) and its contract to lab_src/exercises.py. <module> is `--module` (default the core, pipeline_lab);
a module not yet in `MODULES` is created when `--module-title` gives its title: appended to `MODULES` (last
in course order) and to `MODULE_TITLES`.
Without `--schedule` the exercise is a function called directly ("units" cases). With `--schedule NAME`
(a schedule of lab_src/pipeline/schedules.py, one chunk per rank) it is a pipelined step judged against
that schedule, as q08 is. Its check is q08's, the pipeline check (lab_src/checks/step_check.py). Its hidden
tests are q08's, `pipeline_cases` judged by `pipeline_item` (grader/hidden/common.py): a pipeline case on
every grading configuration, where in every case of 2 stages or more rank 0 changes its embedding by an
amount the answer cannot know (lab_src/pipeline/perturb.py), so that outputs that do not come from the
received activations fail. Its registry entry declares the schedule, and its notebook draws the run.
What is left by hand: the prose, the reference answer, the check, the hidden tests, the cohort's
realistic mistakes (grader/cohort/mistakes.py, handed in by students of grader/cohort/students.py). Everything
else (API, README table, zip-collect pattern, pytest marker, Slurm test totals) follows from the registry.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jupytext

from lab_src.registry import ASSIGNMENT, DEFAULT_STEP, EXERCISES, MODULES

from . import ROOT, SOURCE
from .notebook_text import as_text


def _cell(kind: str, source: str, **nbgrader) -> dict:
    cell = {"cell_type": kind, "metadata": {}, "source": source}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    if nbgrader:
        cell["metadata"]["nbgrader"] = {"schema_version": 3, "task": False, "locked": not nbgrader.get("solution"),
                                        "solution": False, "grade": False, **nbgrader}
    return cell


def hidden_cell_source(qid: str, points: int) -> str:
    """The test cell: in the release, it fails nbgrader's Validate unless the check passed
    (lab_src.grading.require_check); the hidden part, which only the grader runs, stays out of the release."""
    return (f"# Hidden tests of {qid} ({points} points): the grader runs them in fresh processes, outside\n"
            f"# this notebook, and writes the score into the gradebook.\n"
            f"# Validate fails here unless the check above passed.\n"
            f"from lab_src.grading import require_check\n"
            f'require_check("{qid}")\n'
            f"### BEGIN HIDDEN TESTS\nfrom lab_src.grading import scored_out_of_process\n"
            f'scored_out_of_process("{qid}")\n### END HIDDEN TESTS')


def notebook(qid: str, function: str, title: str, points: int, schedule: str = "") -> dict:
    params = "stage, data_iter, num_microbatches" if schedule else ""
    drawn = [_cell("markdown", "## What your code did\n\nTODO: what the timeline shows."),
             _cell("code", "report.timeline()")] if schedule else []
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}, "lab": {"exercise": qid}},
            "cells": [{**cell, "id": f"{qid}-{i}"} for i, cell in enumerate([
                _cell("markdown", f"# {qid.upper()} · {title}\n\n*Exercise {qid} of the pipeline-parallelism lab · "
                                  f"{points} points*\n\nTODO: what this step of pipeline parallelism is, and why."),
                _cell("code", "%load_ext lab_src\nfrom lab_src.checks import check"),
                _cell("markdown", f"## Your task\n\nTODO: the contract of `{function}` (see lab_src/exercises.py)."),
                _cell("code", f"%%answer {qid}\ndef {function}({params}):\n    ### BEGIN SOLUTION\n"
                              f"    raise NotImplementedError()\n    ### END SOLUTION", grade_id=f"{qid}_answer", solution=True),
                _cell("markdown", "## Check\n\nTODO: what the check runs and what it shows."),
                _cell("code", f'report = check("{qid}")'),
                *drawn,
                _cell("code", hidden_cell_source(qid, points), grade_id=f"{qid}_hidden", grade=True, points=points),
            ])]}


VISIBLE_CHECK = '''"""Visible check of {qid} ({function}): TODO say what it runs."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport, errors, finish, make_case, run_cases, run_dir, sources


def check() -> CheckReport:
    srcs = sources("{qid}")
    problems, lines = [], ["{qid} {function}"]
    run = run_cases([make_case("units", VISIBLE, srcs, "{qid}", calls=[])], run_dir("{qid}"))
    problems += errors(run.outcomes[0], "{qid}", VISIBLE.describe())
    return finish("{qid}", run, problems, lines)
'''

HIDDEN_TESTS = '''"""Hidden tests of {qid} ({function}): TODO say what they run."""
from .common import case_problems, Item

QID = "{qid}"


def cases(ctx):
    return [ctx.case(QID, "units", label="calls", calls=[])]


def judge(ctx, outcomes):
    return [Item("calls", o.case.label, case_problems(QID, o, o.case.label)) for o in outcomes]
'''

CONTRACT = '''

@_exercise_api("{qid}")
def {function}():
    """TODO: the contract of {qid}: what {function} takes, returns and raises."""
'''


# q08's visible check (lab_src/checks/q08_afab_step.py): the same pipeline check on the same configurations
STEP_CHECK = '''"""Visible check of {qid} ({function}): the step on 4 stages with 4 micro-batches and on 3 uneven stages
with 2, compared with the unsharded baseline, checked to be a real pipeline and judged against the
"{schedule}" schedule (lab_src/checks/step_check.py). TODO say what else it shows."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport
from lab_src.checks.step_check import pipeline_check


def check() -> CheckReport:
    return pipeline_check("{qid}", [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)], [])
'''

# q08's hidden tests (grader/hidden/q08_afab_step.py), the same case builder and judging helper: a test
# (tests/test_registry.py) compares the cases this writes with q08's
STEP_HIDDEN_TESTS = '''"""Hidden tests of {qid} ({function}): full pipelines of 1 to 4 stages, 1 to 6 micro-batches, uneven layers,
float64 and other seeds, compared with the baseline, checked to be real pipelines and judged against the
"{schedule}" schedule: in every case of 2 stages or more the lab changes stage 0's weights once built, and the
outputs must follow. TODO say what else they judge."""
from .common import pipeline_cases, pipeline_item

QID = "{qid}"


def cases(ctx):
    return pipeline_cases(ctx, QID)


def judge(ctx, outcomes):
    return [pipeline_item(QID, ctx, o) for o in outcomes]
'''

STEP_CONTRACT = '''

@_exercise_api("{qid}")
def {function}(stage, data_iter, num_microbatches):
    """One training step of `stage` over `num_microbatches` micro-batches in the order of the "{schedule}"
    schedule (lab_src/pipeline/schedules.py). TODO: the rest of the contract of {qid}. Loss, scaling and
    return value are those of `afab_step` (q08): on the last stage `(outputs, loss)` with each micro-batch's
    output (detached, in micro-batch order) and the total loss as a float; on other stages `([], None)`.
    """
'''


def create(qid: str, function: str, title: str = "TODO title", points: int = 10, schedule: str = "",
           needs: tuple[str, ...] | None = None, module: str = ASSIGNMENT, topic: str = "",
           module_title: str = "") -> list[Path]:
    """Write the skeleton of exercise `qid`; with `schedule`, a pipelined step judged against that schedule,
    whose answers `needs` by default those of the lab's first step (q08); with `topic`, an exercise of that
    topic after the core, checked and graded through the topic's case kind (grader/new_topic.py writes the
    topic's folder when it is new); with `module_title`, `module` is a new course module of that title."""
    if schedule and topic:
        raise SystemExit("--schedule and --topic: a step of the core's schedules, or an exercise of a topic, not both")
    if not re.fullmatch(r"q\d\d", qid) or not re.fullmatch(r"[a-z][a-z0-9_]*", function):
        raise SystemExit("usage: python -m grader new qNN function_name (e.g. q11 p2p_exchange)")
    if qid in EXERCISES:
        raise SystemExit(f"{qid} exists already ({EXERCISES[qid].notebook})")
    if schedule:
        check_schedule(schedule)
        needs = EXERCISES[DEFAULT_STEP].needs if needs is None else tuple(needs)
    unknown = [q for q in needs or () if q not in EXERCISES]
    if unknown:
        raise SystemExit(f"--needs: no exercise {', '.join(unknown)}")
    new_module = module not in MODULES
    if new_module and not module_title:
        raise SystemExit(f"--module: no module {module!r}; the modules are {', '.join(MODULES)} (lab_src/registry.py); "
                         f"give --module-title to create it")
    if module_title and not new_module:
        raise SystemExit(f"--module-title: the module {module!r} exists (its title: lab_src/registry.py MODULE_TITLES)")
    if new_module and not re.fullmatch(r"[a-z][a-z0-9_]*", module):
        raise SystemExit(f"--module {module!r}: a module's name is its folder's (lowercase letters, digits, _)")
    if '"' in module_title or "\\" in module_title:
        raise SystemExit("--module-title: no quotes or backslashes")
    course_module, module = module, f"{qid}_{function}"
    written = []

    def put(path: Path, text: str) -> None:
        if path.exists():
            raise SystemExit(f"{path} exists already")
        path.write_text(text)
        written.append(path)

    (SOURCE / course_module).mkdir(exist_ok=True)
    nb_path = SOURCE / course_module / f"{module}.ipynb"
    nb = jupytext.reads(json.dumps(notebook(qid, function, title, points, schedule)), fmt="ipynb")
    if nb_path.exists():
        raise SystemExit(f"{nb_path} exists already")
    jupytext.write(nb, nb_path, fmt="ipynb")
    written.append(nb_path)
    put(nb_path.with_suffix(".py"), as_text(nb_path))
    names = dict(qid=qid, function=function, schedule=schedule, topic=topic)
    if topic:
        from .new_topic import TOPIC_CHECK, TOPIC_HIDDEN_TESTS, add
        written += add(topic, qid, function, title)
        check, hidden = TOPIC_CHECK, TOPIC_HIDDEN_TESTS
    else:
        check, hidden = (STEP_CHECK, STEP_HIDDEN_TESTS) if schedule else (VISIBLE_CHECK, HIDDEN_TESTS)
    put(ROOT / "lab_src" / "checks" / f"{module}.py", check.format(**names))
    put(ROOT / "grader" / "hidden" / f"{module}.py", hidden.format(**names))

    registry = ROOT / "lab_src" / "registry.py"
    text = registry.read_text()
    listed = ", ".join(f'"{q}"' for q in needs or ())
    entry = f'    Exercise("{qid}", "{function}", "{title}", ({listed}{"," if len(needs or ()) == 1 else ""})'
    if schedule:   # drawn and credited as the lab's other steps are (q08, q12)
        entry += (f',\n             schedule="{schedule}", timeline="more micro-batches than stages", '
                  f'other_schedule_credit=0.5')
    text = text.replace("\n]}", "\n" + entry + "),\n]}", 1)
    if new_module:   # a new module, last in course order: its line in MODULES and its title in MODULE_TITLES
        text = _append_to_dict(text, "MODULES", f'    "{course_module}": ("{qid}",),')
        text = _append_to_dict(text, "MODULE_TITLES", f'    "{course_module}": "{module_title}",')
    else:            # ... into its module's tuple of MODULES (the line `    "<module>": (...),`; the core's key is ASSIGNMENT)
        key = "ASSIGNMENT" if course_module == ASSIGNMENT else re.escape(f'"{course_module}"')
        text = re.sub(rf"(\n    {key}: \()([^)]*)\)",
                      lambda m: m.group(1) + (m.group(2).rstrip().rstrip(",") + ", " if m.group(2).strip() else "")
                      + f'"{qid}"' + ("" if m.group(2).strip() else ",") + ")", text, count=1)   # a module of one: a tuple
    registry.write_text(text)
    written.append(registry)
    exercises = ROOT / "lab_src" / "exercises.py"
    text = exercises.read_text()
    marker = "\n\n_missing = "
    contract = (STEP_CONTRACT if schedule else CONTRACT).format(**names)
    exercises.write_text(text.replace(marker, contract.rstrip("\n") + "\n" + marker, 1))
    written.append(exercises)
    return written


def _append_to_dict(text: str, name: str, line: str) -> str:
    """registry.py's text with `line` added as the last item of the dict `name` (from `name: ... = {` to its closing brace)."""
    start = re.search(rf"^{name}: [^\n]*= {{\n", text, re.MULTILINE)
    if not start:
        raise SystemExit(f"lab_src/registry.py: no `{name}: ... = {{` to add the new module to")
    end = text.index("\n}", start.end())
    return text[:end] + "\n" + line + text[end:]


def check_schedule(name: str) -> None:
    """A schedule the pipeline cases can run: declared in lab_src/pipeline/schedules.py, one chunk per rank."""
    from lab_src.pipeline.schedules import SCHEDULES, schedule
    try:
        chunks = schedule(name).chunks_per_rank
    except KeyError:
        raise SystemExit(f"--schedule: no schedule {name!r}; declare it in lab_src/pipeline/schedules.py "
                         f"(the schedules: {', '.join(SCHEDULES)})") from None
    if chunks != 1:
        raise SystemExit(f"--schedule {name}: a schedule of {chunks} chunks per rank runs in interleaved cases "
                         f"(as q15 does), not in the pipeline check that `grader new` writes")
