"""README's table of exercises, written from the registry and the source notebooks' points.

    python -m grader readme      # rewrite the table between the markers in README.md

tests/test_registry.py fails when README's table is not what this writes, so README never counts by hand.
"""
from __future__ import annotations

import json
from pathlib import Path

from lab_src.registry import EXERCISES

from . import ROOT, SOURCE

BEGIN, END = "<!-- exercises: written by `python -m grader readme` -->", "<!-- end of exercises -->"


def points(ex) -> tuple[float, float]:
    """(autograded points, hand-graded points) of an exercise, from its source notebook's nbgrader cells."""
    nb = json.loads((SOURCE / ex.assignment / ex.notebook).read_text())
    auto = manual = 0.0
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade"):
            if meta.get("grade_id") == ex.hidden_cell:
                auto += float(meta.get("points", 0))
            else:
                manual += float(meta.get("points", 0))
    return auto, manual


def table() -> str:
    rows = ["| exercise | notebook | students write | schedule | autograded | by hand |", "|---|---|---|---|---|---|"]
    total_auto = total_manual = 0.0
    for ex in EXERCISES.values():
        auto, manual = points(ex)
        total_auto, total_manual = total_auto + auto, total_manual + manual
        what = f"`{ex.function}`" if ex.function else "written answers"
        rows.append(f"| {ex.id} {ex.title} | `{ex.notebook}` | {what} | {ex.schedule or ''} | {auto:g} | {manual:g} |")
    rows.append(f"| **{len(EXERCISES)} exercises** | | | | **{total_auto:g}** | **{total_manual:g}** |")
    return "\n".join(rows)


def section() -> str:
    return f"{BEGIN}\n{table()}\n{END}"


def current(readme: Path = ROOT / "README.md") -> str:
    text = readme.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def update(readme: Path = ROOT / "README.md") -> bool:
    text = readme.read_text()
    new = text.replace(current(readme), section())
    readme.write_text(new)
    return new != text
