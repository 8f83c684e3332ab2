"""`python -m grader new qNN function_name --topic NAME`: an exercise of a topic after the core, and the topic's
folder `lab_src/topics/NAME/` when it is new (the layout: lab_src/topics/__init__.py).

A new topic's skeleton is its declaration (`__init__.py`: the exercise, one case kind named as the topic),
`records.py` (the record its ranks fill and the settings its cases carry, with the case's degrees: torch-free),
`kind.py` (what each rank of a case does: its mesh from the degrees, the answer's collectives bounded to the case,
the exercise's function called and what it got recorded) and `judge.py` (the problems a run shows). No core file
changes: the core's tables read the declaration, and comm/ gives the mesh, the recorders and the lanes. For a topic that exists, the exercise joins its
declaration's `exercises`. The exercise's visible check and hidden tests (new_exercise.py) then run the
topic's kind and judge with the topic's judge.
"""
from __future__ import annotations

import re
from pathlib import Path

from . import ROOT

TOPICS = ROOT / "lab_src" / "topics"

DECLARATION = '''"""{title} ({qid}).

    records.py   what its kind and judge share, torch-free, and the record each rank fills
    kind.py      rank side: TODO what the ranks of a case do
    judge.py     parent side: the problems a run shows
"""
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="{topic}",
    title="{title}",
    exercises=("{qid}",),
    kinds={{"{topic}": Kind("kind", record="records:{record}", settings="records:{settings}", calls=("{function}",),
                           what="TODO: what the ranks of a {topic} case do")}},
)
'''

RECORDS = '''"""What the {topic} kind (kind.py) and judge (judge.py) share, torch-free, and the record each rank fills."""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings


@dataclass(frozen=True)
class {settings}(Settings):
    """The numbers a {topic} case runs on (TODO: each with its default), and how its ranks are laid out."""

    def degrees(self, case) -> dict[str, int]:
        return {{"dp": case.stages}}         # TODO: the case's ranks as named dimensions (comm/mesh.py)


class {record}(Observed):
    result: dict                # TODO: declare every field kind.py fills, with what it holds
'''

KIND = '''"""Rank side of {topic} ({qid}): TODO what each rank of a case does."""
from __future__ import annotations

from lab_src import exercises
from lab_src.comm import collectives
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    try:
        with collectives.bounded(range(case.stages)):
            # every group of the case's dimensions, made on every rank in one order (a dimension that spans the
            # whole case is the case's own group)
            mesh = Mesh.of(case, ctx, whole=group).build(*settings.degrees(case))
            # TODO: give the answer what a rank of this topic has (mesh.group("dp"), ...), and record what it did
            obs["result"] = observe.attempt(exercises.{function})
            observe.finish_messages(None, group, tracer)
            mesh.destroy()
    finally:
        observe.record_instrumentation(obs, tracer)
'''

JUDGE = '''"""Parent side of {topic} ({qid}): the problems a run of its kind shows, from what its ranks recorded."""
from __future__ import annotations

from lab_src.judge.problems import Problem


def judge_run(outcome) -> list[Problem]:
    """TODO: compare what each rank observed with the unsharded computation, recomputed here."""
    problems = []
    for rank, o in sorted(outcome.obs.items()):
        if (o.result or {{}}).get("outcome") == "raised":
            problems.append(Problem(f"{function} raised {{o.result.get('type')}}: {{o.result.get('message')}}", rank=rank))
    return problems
'''


def record_name(topic: str) -> str:
    return "".join(part.capitalize() for part in topic.split("_")) + "Observed"


def add(topic: str, qid: str, function: str, title: str) -> list[Path]:
    """Write the topic's skeleton, or add `qid` to the declaration of the topic that exists."""
    if not re.fullmatch(r"[a-z][a-z0-9_]*", topic):
        raise SystemExit(f"--topic {topic!r}: a topic is named as a Python package (data_parallel, ...)")
    folder = TOPICS / topic
    init = folder / "__init__.py"
    if init.exists():
        text = init.read_text()
        found = re.search(r"exercises=\(([^)]*)\)", text)
        if not found:
            raise SystemExit(f"{init}: no `exercises=(...)` in its declaration to add {qid} to")
        listed = [q.strip().strip('"') for q in found.group(1).split(",") if q.strip()]
        new = ", ".join(f'"{q}"' for q in [*listed, qid]) + ("," if not listed else "")
        init.write_text(text[:found.start(1)] + new + text[found.end(1):])
        return [init]
    folder.mkdir(parents=True)
    names = dict(topic=topic, qid=qid, function=function, title=title, record=record_name(topic),
                 settings=record_name(topic).removesuffix("Observed") + "Settings")
    written = []
    for name, template in (("__init__.py", DECLARATION), ("records.py", RECORDS), ("kind.py", KIND),
                           ("judge.py", JUDGE)):
        (folder / name).write_text(template.format(**names))
        written.append(folder / name)
    return written


TOPIC_CHECK = '''"""Visible check of {qid} ({function}): a case of the {topic} topic's kind on 2 ranks, judged by its judge
(lab_src/topics/{topic}/). TODO say what it runs and shows."""
from __future__ import annotations

from lab_src.checks.common import VISIBLE, CheckReport, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped


def check() -> CheckReport:
    from lab_src.topics.{topic}.judge import judge_run
    srcs = sources("{qid}")
    cfg = VISIBLE.replace(num_stages=2)
    run = run_cases([make_case("{topic}", cfg, srcs, "{qid}")], run_dir("{qid}"))
    outcome = run.outcomes[0]
    problems = errors(outcome, "{qid}", cfg.describe()) or stamped(judge_run(outcome), "{qid}", cfg.describe())
    return finish("{qid}", run, problems, ["{qid} {function}"])
'''

TOPIC_HIDDEN_TESTS = '''"""Hidden tests of {qid} ({function}): cases of the {topic} topic's kind on 2 and 4 ranks, judged by its judge
(lab_src/topics/{topic}/judge.py). TODO say what else they judge."""
from lab_src.judge.problems import stamped
from lab_src.topics.{topic}.judge import judge_run

from .common import Item, case_problems

QID = "{qid}"


def cases(ctx):
    return [ctx.case(QID, "{topic}", label=f"{{p}} ranks", stages=p) for p in (2, 4)]


def judge(ctx, outcomes):
    return [Item("{topic}", o.case.label, case_problems(QID, o, o.case.label) or stamped(judge_run(o), QID, o.case.label))
            for o in outcomes]
'''
