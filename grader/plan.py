"""A course's choice of modules: which assignments it hands out, their due dates, points that differ.

One small file, `course.toml`, in the course folder (or, for every course of a checkout, at the repository's
root); without one a course hands out every module of lab_src/registry.py, each its own nbgrader assignment:

    modules = ["pipeline_lab"]                 # in course order; a core-only course
    [due]                                      # optional: nbgrader due dates, per assignment
    pipeline_lab = "2026-10-09 23:59:00 UTC"
    [points]                                   # optional: autograded points per exercise (else the notebook's)
    q08 = 20
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from lab_src.registry import EXERCISES, MODULES, module_of

from . import ROOT

FILE = "course.toml"


def parse_toml(text: str) -> dict:
    """tomllib on Python 3.11+; on 3.10 (which pyproject.toml allows) the small subset course.toml uses:
    `key = "string" | number | ["a", "b"]` lines under optional `[section]` headers, `#` comments."""
    try:
        import tomllib
        return tomllib.loads(text)
    except ImportError:
        pass
    data: dict = {}
    table = data
    for n, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"\s+#[^\"\]]*$|^\s*#.*$", "", line).strip()
        if not line:
            continue
        if m := re.fullmatch(r"\[([A-Za-z0-9_.-]+)\]", line):
            table = data.setdefault(m.group(1), {})
        elif m := re.fullmatch(r"([A-Za-z0-9_-]+)\s*=\s*(.+)", line):
            table[m.group(1)] = ast.literal_eval(m.group(2))
        else:
            raise PlanError(f"{FILE} line {n}: cannot read {line!r}")
    return data


class PlanError(ValueError):
    """course.toml names what does not exist, or a module without the earlier modules it needs."""


@dataclass(frozen=True)
class Plan:
    modules: tuple[str, ...] = tuple(m for m, qids in MODULES.items() if qids)
    due: dict[str, str] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)
    path: Path | None = None        # the file it came from (None: the default)

    def exercises(self, assignment: str) -> list:
        return [EXERCISES[q] for q in MODULES[assignment]]

    def is_default(self) -> bool:
        """Whether this plan is the default course's (every module, no due dates, the notebooks' points),
        whatever file it came from: the repository's notebooks/ hold that course's release."""
        return self.modules == Plan().modules and not self.due and not self.points

    def choose(self, assignment: str | None) -> list[str]:
        """The assignments a command acts on: `assignment`, or (None) every one of the course."""
        if assignment is None:
            return list(self.modules)
        if assignment not in self.modules:
            where = self.path or "the default course (no course.toml)"
            raise PlanError(f"{assignment!r} is not an assignment of this course ({where}): "
                            f"its assignments are {', '.join(self.modules)}")
        return [assignment]


def check(plan: Plan) -> Plan:
    where = plan.path or FILE
    unknown = [m for m in plan.modules if m not in MODULES]
    if unknown:
        raise PlanError(f"{where}: no module {', '.join(unknown)}; the modules are {', '.join(MODULES)}")
    empty = [m for m in plan.modules if not MODULES[m]]
    if empty:
        raise PlanError(f"{where}: the module {', '.join(empty)} has no exercises yet")
    order = list(plan.modules)
    for m in order:
        for q in MODULES[m]:
            for need in EXERCISES[q].needs:
                owner = module_of(need)
                if owner not in order or order.index(owner) > order.index(m):
                    raise PlanError(f"{where}: {q} of {m} builds on {need} of {owner}, which must come before "
                                    f"{m} in `modules`")
    for a in plan.due:
        if a not in order:
            raise PlanError(f"{where}: [due] names {a}, which is not in `modules`")
    for q in plan.points:
        if q not in EXERCISES or module_of(q) not in order:
            raise PlanError(f"{where}: [points] names {q}, which is no exercise of this course's modules")
    return plan


def load(course_root: Path | str | None = None) -> Plan:
    """The plan of the course folder `course_root`: its course.toml, else the repository's, else the default."""
    candidates = ([Path(course_root) / FILE] if course_root else []) + [ROOT / FILE]
    for path in candidates:
        if path.is_file():
            data = parse_toml(path.read_text())
            modules = tuple(data.get("modules") or Plan().modules)
            return check(Plan(modules, {k: str(v) for k, v in data.get("due", {}).items()},
                              {k.lower(): float(v) for k, v in data.get("points", {}).items()}, path.resolve()))
    return check(Plan())


def write(course_root: Path | str, modules, due: dict | None = None, points: dict | None = None) -> Path:
    """course.toml for `modules` (the tests and the demo write one; an instructor edits it by hand)."""
    lines = ["modules = [" + ", ".join(f'"{m}"' for m in modules) + "]"]
    if due:
        lines += ["", "[due]"] + [f'{a} = "{d}"' for a, d in due.items()]
    if points:
        lines += ["", "[points]"] + [f"{q} = {p:g}" for q, p in points.items()]
    path = Path(course_root) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    check(Plan(tuple(modules), dict(due or {}), dict(points or {}), path))
    return path
