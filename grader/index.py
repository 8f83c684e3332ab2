"""The page each released assignment opens with: README.md in notebooks/<assignment>/ (what it covers, in
which order, how long each check takes, how the points are split), written from the registry and the source
notebooks' points at every release."""
from __future__ import annotations

import json

from lab_src.registry import MODULE_TITLES, MODULES, module_of

# `course` below is a grader.course.Course, which calls this module (generate_release): it is named in the
# annotations as a string and never imported here, so that the two modules do not import each other.
# what a visible check costs on a laptop's CPU, torchrun start-up included (an upper bound: not measured per
# notebook; benchmarks/validate_time.py times a whole notebook)
CHECK_TIME = "up to a minute"


def points_of(course: "Course", ex) -> tuple[float, float]:
    """(autograded, written) points of `ex` in `course`: course.toml's, else the source notebook's."""
    nb = json.loads((course.source / ex.assignment / ex.notebook).read_text())
    auto = written = 0.0
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("points") is None:
            continue
        if meta.get("grade_id") == ex.hidden_cell:
            auto += float(course.plan.points.get(ex.id, meta["points"]))
        else:
            written += float(meta["points"])
    return auto, written


def index_text(course: "Course") -> str:
    a = course.assignment
    order = list(course.plan.modules)
    earlier = sorted({module_of(n) for ex in course.exercises for n in ex.needs} - {a}, key=order.index)
    lines = [f"# {a}: {MODULE_TITLES.get(a, a)}", ""]   # the titles: lab_src/registry.py
    if a in order:
        lines.append(f"Assignment {order.index(a) + 1} of {len(order)} of this course ({', '.join(order)}).")
    if earlier:
        lines.append(f"It builds on your answers to {', '.join(earlier)}: keep that folder beside this one "
                     f"(`../{earlier[0]}/`); a check that needs an answer you have not written says which "
                     f"notebook to finish first.")
    due = course.plan.due.get(a)
    if due:
        lines.append(f"Due: {due}.")
    lines += ["", "Work through the notebooks in this order; run each one's check cell when its answer cell is done.", "",
              "| notebook | what | its check takes | autograded | written |", "|---|---|---|---:|---:|"]
    total_auto = total_written = 0.0
    for ex in course.exercises:
        auto, written = points_of(course, ex)
        total_auto += auto
        total_written += written
        check = CHECK_TIME if ex.function else "(written answers)"
        lines.append(f"| `{ex.notebook}` | {ex.title} | {check} | {auto:g} | {written:g} |")
    lines += [f"| **{len(course.exercises)} notebooks** | | | **{total_auto:g}** | **{total_written:g}** |", "",
              "Autograded points come from hidden tests run by the grader after you submit (your visible checks "
              "run a subset of them); written answers are graded by hand. Submit the whole folder.", ""]
    return "\n".join(lines)


def write_index(course: "Course") -> None:
    folder = course.release / course.assignment
    if folder.is_dir() and MODULES.get(course.assignment):
        (folder / "README.md").write_text(index_text(course))
