"""The topics after the core, one folder each: what a topic declares, and the tables the core reads from it.

A topic is a parallelism (or a part of one) taught by one or more exercises after the core: its folder
`lab_src/topics/<name>/` holds everything that is only its own, read in one place:

    __init__.py        its declaration, `TOPIC = Topic(...)`: data only, no torch (this page's classes)
    records.py         what its kinds and judges share, torch-free: the typed record each kind's ranks fill
                       (harness/observed.py), the typed settings both sides read (harness/settings.py), names of parts
    kind*.py           rank side: `run(case, ctx, group, tracer, obs)` of each case kind it declares
    judge*.py          parent side: the problems a run of its kinds shows (never imports a kind, nor a kind it)
    runtime modules    what its ranks are given or record (a recorder's `install()`, a grid, a stage class)
    pictures           its figures and timelines

The core (`pipeline/`, `harness/`, `comm/`, `judge/`, `views/`) never imports a topic's modules: it reads the
declarations below through `all_topics()` (the case kinds' table, the event kinds' names, colours and labels,
the recorders a rank installs), so a new topic is one new folder and no core table changes. A topic imports
the core (comm/ for process groups, meshes, recorders and lanes), and of another topic only what the course builds
on (q13's digits and training), never its kinds or judges, and nothing of a topic later in `lab_src.registry.MODULES`
order; tests/test_import_rules.py holds these rules. `python -m grader new --topic NAME` writes a new topic's skeleton.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab_src.comm import EventKind  # noqa: F401 - what a topic declares its event kinds with

# the exercise functions that building a pipeline stage calls (q02, q03, q05): most kinds' `calls` start with them
LAYOUT = ("check_args", "activation_shape", "distribute_layers")


@dataclass(frozen=True)
class Kind:
    """A kind of check case: what the ranks of a case do. A topic names its modules relative to its own folder
    ("kind", "records:GridObserved"); `all_topics()` gives them in full."""
    module: str                 # the module whose `run(case, ctx, group, tracer, obs)` runs a case of this kind
    calls: tuple[str, ...]      # the exercise functions its ranks call: a case must carry their answers
    what: str                   # what its ranks do, in a line or two
    step: bool = False          # its ranks also call the case's step, and what that step uses
    record: str = ""            # "module:Class", the typed record its ranks fill ("": harness/observed.py's Observed)
    settings: str = ""          # "module:Class", its typed settings (harness/settings.py; "": it takes none)
    timeout_factor: int = 1     # its groups' and barriers' timeout is this many times the launch's (harness/worker.py)
    # its ranks' bytes on the wire are counted from outside them, at the case's fences, and held against their
    # record (harness/wire.py, judge/wire.py)
    wire: bool = False
    # "module:function", what the timeline of a case of this kind draws (its outcome -> the view's dict), the same in
    # the visible check and in the grader's saved run ("": views/saved.py `case_view`, a pipeline's run)
    view: str = ""

    def within(self, package: str) -> "Kind":
        def full(name: str) -> str:
            return name if not name or name.startswith("lab_src.") else f"{package}.{name}"
        return replace(self, module=full(self.module), record=full(self.record), settings=full(self.settings),
                       view=full(self.view))


@dataclass(frozen=True)
class Topic:
    name: str                                   # its folder's name
    title: str                                  # one line
    exercises: tuple[str, ...]                  # the exercises (registry ids) that teach it
    kinds: dict = field(default_factory=dict)   # case kind -> Kind
    events: tuple = ()                          # EventKind, in the order a legend lists them
    recorders: tuple = ()                       # modules whose `install()` every rank calls before its first case


FOLDER = Path(__file__).resolve().parent


@functools.lru_cache(maxsize=1)
def all_topics() -> tuple[Topic, ...]:
    """Every topic's declaration, in course order (the position of its first exercise in MODULES)."""
    from lab_src.registry import MODULES
    order = [q for qids in MODULES.values() for q in qids]
    found = []
    for info in pkgutil.iter_modules([str(FOLDER)]):
        if not info.ispkg:
            continue
        package = f"{__name__}.{info.name}"
        topic = importlib.import_module(package).TOPIC
        if topic.name != info.name:
            raise ValueError(f"lab_src/topics/{info.name}/ declares the topic {topic.name!r}: name it as its folder")
        found.append(replace(topic, kinds={k: v.within(package) for k, v in topic.kinds.items()},
                             recorders=tuple(r if r.startswith("lab_src.") else f"{package}.{r}" for r in topic.recorders)))
    return tuple(sorted(found, key=lambda t: min(order.index(q) for q in t.exercises)))


def topic_of(module: str) -> Topic | None:
    """The topic a module `lab_src.topics.<name>....` belongs to, else None."""
    parts = module.split(".")
    if parts[:2] != ["lab_src", "topics"] or len(parts) < 3:
        return None
    return next((t for t in all_topics() if t.name == parts[2]), None)


def kinds() -> dict[str, Kind]:
    """Every topic's case kinds (the core's own are in harness/kinds/__init__.py)."""
    out = {}
    for t in all_topics():
        for name, kind in t.kinds.items():
            if name in out:
                raise ValueError(f"two topics declare the case kind {name!r}")
            out[name] = kind
    return out


def event_kinds() -> tuple[EventKind, ...]:
    """The core's (lab_src/comm: the answer's own torch.distributed collectives), then every topic's."""
    from lab_src import comm
    return comm.EVENTS + tuple(e for t in all_topics() for e in t.events)


def recorders() -> tuple[str, ...]:
    """The core's (lab_src/comm: raw messages, raw collectives), then any a topic adds."""
    from lab_src import comm
    return comm.RECORDERS + tuple(r for t in all_topics() for r in t.recorders)
