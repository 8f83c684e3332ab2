"""The layout of lab_src: the core by role, each topic after the core in its own folder (lab_src/topics/).

The rules, read from the source's imports (tests/test_import_rules.py's graph: every import, at the top of a
module or inside a function; that file holds the rule against import circles):
1. the core (`pipeline/`, `harness/`, `comm/`, `judge/`, `views/`) imports no topic's module: it reads the topics'
   declarations through `lab_src.topics` alone;
2. a topic imports the core and the topics before it in course order (MODULES), never a later one, and of another
   topic never its kinds or judges (what several topics share at run time lives in the core: comm/ for process
   groups, meshes, recorders and lanes); the topics stand at most 2 floors above the core, with at most 3 arrows
   between them (what the course builds on, such as q13's digits);
3b. process groups are made in two places, the case's own (harness/groups.py) and a mesh (comm/mesh.py), besides
   q14's `Grid` (topics/dp_pp/grid.py), the student's own: no topic's kind calls `new_group`;
3. a kind (rank side: `harness/kinds/*`, `topics/*/kind*.py`) and a judge (parent side: `judge/*`,
   `topics/*/judge*.py`) never import each other: what both read lives in a torch-free module of the topic;
4. every topic's declaration (its `__init__.py`), every record class it names, and the tables the core
   builds from them import no torch;
and what the declarations say resolves: each kind's module defines `run`, each record is an `Observed`, each
recorder has `install`, each event kind has a colour and a label the pictures use.
"""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from conftest import ROOT
from test_import_rules import import_graph

CORE = ("lab_src.pipeline", "lab_src.harness", "lab_src.comm", "lab_src.judge", "lab_src.views")


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def topic_name(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if parts[:2] == ["lab_src", "topics"] and len(parts) > 2 else None


def is_kind(module: str) -> bool:
    leaf = module.rpartition(".")[2]
    return (module.startswith("lab_src.harness.kinds.") and module != "lab_src.harness.kinds") or \
        (topic_name(module) is not None and leaf.startswith("kind"))


def is_judge(module: str) -> bool:
    leaf = module.rpartition(".")[2]
    return module.startswith("lab_src.judge.") or (topic_name(module) is not None and leaf.startswith("judge"))


def test_the_core_imports_no_topic(graph):
    bad = [f"{m} imports {d}" for m, ds in graph.items() if m.startswith(CORE) for d in ds if topic_name(d)]
    assert not bad, "the core must read topics through their declarations (lab_src.topics):\n" + "\n".join(bad)


def test_a_topic_imports_only_the_core_and_the_topics_before_it(graph):
    from lab_src.topics import all_topics
    order = [t.name for t in all_topics()]
    bad = []
    for m, ds in graph.items():
        mine = topic_name(m)
        if mine is None:
            continue
        for d in ds:
            other = topic_name(d)
            if d.startswith(("grader", "lab_src.checks", "lab_src.grading", "lab_src.magic")):
                bad.append(f"{m} imports {d}, which is not the core")
            elif other and order.index(other) > order.index(mine):
                bad.append(f"{m} imports {d}, of the later topic {other}")
    assert not bad, "\n".join(bad)


def topic_arrows(graph) -> dict[tuple[str, str], set[str]]:
    """{(topic, another topic it imports): the modules of the other that it imports}."""
    arrows: dict[tuple[str, str], set[str]] = {}
    for m, ds in graph.items():
        for d in ds:
            mine, other = topic_name(m), topic_name(d)
            if mine and other and other != mine:
                arrows.setdefault((mine, other), set()).add(d)
    return arrows


def test_a_topic_never_imports_another_topics_kinds_or_judges(graph):
    bad = [f"{m} imports {d}" for m, ds in graph.items() for d in ds
           if topic_name(m) and topic_name(d) and topic_name(d) != topic_name(m) and (is_kind(d) or is_judge(d))]
    assert not bad, ("a topic's kinds and judges are its own; what several topics need at run time belongs in the "
                     "core (lab_src/comm, lab_src/judge):\n" + "\n".join(bad))


def test_the_topics_stand_at_most_two_floors_above_the_core_with_three_arrows_between_them(graph):
    arrows = topic_arrows(graph)
    above: dict[str, set[str]] = {}
    for mine, other in arrows:
        above.setdefault(mine, set()).add(other)

    def floor(t: str, seen=()) -> int:
        assert t not in seen, f"topics import each other in a circle: {seen + (t,)}"
        return 1 + max((floor(o, seen + (t,)) for o in above.get(t, ())), default=0)

    from lab_src.topics import all_topics
    floors = {t.name: floor(t.name) for t in all_topics()}
    said = "; ".join(f"{a} -> {b} ({', '.join(sorted(ms))})" for (a, b), ms in sorted(arrows.items()))
    assert max(floors.values()) <= 2, f"topic floors {floors}: {said}"
    assert len(arrows) <= 3, f"{len(arrows)} arrows between topics: {said}"


def test_process_groups_are_made_by_the_case_the_mesh_and_q14s_grid_only():
    import ast
    allowed = {"lab_src/harness/groups.py", "lab_src/comm/mesh.py", "lab_src/topics/dp_pp/grid.py"}
    found = set()
    for path in sorted((ROOT / "lab_src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "new_group":
                found.add(path.relative_to(ROOT).as_posix())
    assert found - allowed == set(), f"process groups made outside the mesh: {sorted(found - allowed)}"
    assert {"lab_src/harness/groups.py", "lab_src/comm/mesh.py"} <= found


def test_a_kind_and_a_judge_never_import_each_other(graph):
    bad = [f"{m} imports {d}" for m, ds in graph.items() for d in ds
           if (is_kind(m) and is_judge(d)) or (is_judge(m) and is_kind(d))]
    assert not bad, "what a kind and its judge share belongs in the topic's records.py:\n" + "\n".join(bad)


def test_the_declarations_and_the_tables_built_from_them_import_no_torch():
    code = ("import sys\n"
            "from lab_src import topics\n"
            "from lab_src.harness.kinds import KINDS\n"
            "from lab_src.harness.observed import record_class\n"
            "from lab_src.pipeline import trace\n"
            "for kind in KINDS: record_class(kind)\n"
            "assert topics.all_topics() and trace.COLLECTIVES\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy', 'matplotlib'))\n"
            "assert not heavy, heavy\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_what_the_topics_declare_resolves():
    from lab_src.harness.kinds import KINDS
    from lab_src.harness.observed import Observed, record_class
    from lab_src.registry import EXERCISES
    from lab_src.topics import all_topics, event_kinds, recorders
    from lab_src.views.prepare import BOX_LABELS, COLLECTIVE_LABELS, COLORS
    seen = set()
    for t in all_topics():
        assert t.exercises and all(q in EXERCISES for q in t.exercises), t
        assert not seen & set(t.exercises), f"two topics claim {seen & set(t.exercises)}"
        seen |= set(t.exercises)
        folder = ROOT / "lab_src" / "topics" / t.name
        assert (folder / "records.py").exists() or not t.kinds, f"{t.name} has kinds but no records.py"
    for kind, k in KINDS.items():
        assert callable(importlib.import_module(k.module).run), kind
        assert issubclass(record_class(kind), Observed) and record_class(kind) is not Observed, kind
    for r in recorders():
        assert callable(importlib.import_module(r).install), r
    for e in event_kinds():
        assert COLORS[e.name] == e.colour
        assert (COLLECTIVE_LABELS if e.collective else BOX_LABELS)[e.name] == e.label


def test_a_record_refuses_a_field_it_does_not_declare():
    """A renamed field fails where it is written and where it is read, instead of reading as None."""
    from lab_src.harness.observed import UndeclaredField, observed
    o = observed("pipeline", {"kind": "pipeline", "rank": 0, "stages": 2, "error": None, "grads": {}})
    assert o.grads == {} and o.loss is None and o.get("loss", 1.5) == 1.5
    for touch in (lambda: o.__setitem__("gradients", {}), lambda: o.get("gradients"), lambda: o["gradients"],
                  lambda: observed("pipeline", {"gradients": {}})):
        with pytest.raises(UndeclaredField, match="gradients"):
            touch()
    with pytest.raises(AttributeError):
        o.gradients     # noqa: B018
    assert o.optional("tp") is None     # a reader of every kind asks for what only some kinds have
    assert type(o.plain()) is dict
