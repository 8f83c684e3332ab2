"""Grades out of the gradebook: a table per exercise for the terminal, and CSV exports.

`grade_rows(course)` reads one assignment (the one `course` acts on); `course_rows(course)` every assignment of
the course, one row per student with a column per assignment (its points) and per exercise."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from lab_src.registry import EXERCISES

from .course import COURSE_ID, Course


def grade_rows(course: Course) -> list[dict]:
    """One row per student with a submission (in the gradebook, or returned and not yet in it):
    autograded points per exercise, written answers, totals, and the grading state with its reason."""
    from nbgrader.api import Gradebook, MissingEntry
    rows = []
    returned = set(course.students())
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        for student in sorted({s.id for s in gb.students} | returned):
            state = grading_state(course, student)
            try:
                sub = gb.find_submission(course.assignment, student)
            except MissingEntry:
                if student in returned:
                    rows.append({"student": student, **state, "autograded": 0.0, "autograded_max": 0.0,
                                 "written": 0.0, "written_max": 0.0, "written_pending": 0})
                continue
            row = {"student": student, **state}
            auto = auto_max = manual = manual_max = 0.0
            pending = 0
            for nb in sub.notebooks:
                for g in nb.grades:
                    if g.name.endswith("_hidden"):
                        row[g.name[:3]] = g.score
                        auto += g.score
                        auto_max += g.max_score
                    else:
                        manual_max += g.max_score
                        if g.needs_manual_grade and g.manual_score is None:
                            pending += 1
                        else:
                            manual += g.score
            row.update(autograded=round(auto, 2), autograded_max=auto_max, written=round(manual, 2),
                       written_max=manual_max, written_pending=pending)
            rows.append(row)
    return rows


def grading_state(course: Course, student: str) -> dict:
    """{"state": graded / running / failed / waiting, "error": the reason, for a failed one}."""
    path = course.grading_dir(student) / "status.json"
    status = json.loads(path.read_text()) if path.exists() else {}
    out = {"state": status.get("state", "waiting")}
    if status.get("error"):
        out["error"] = status["error"]
    return out


def course_rows(course: Course, assignment: str | None = None) -> list[dict]:
    """One row per student over the course's assignments (or `assignment`): each exercise's points, each
    assignment's points (autograded + written) under its name, the totals, and the worst grading state."""
    merged: dict[str, dict] = {}
    rank = {"failed": 3, "running": 2, "waiting": 1, "graded": 0}
    for one in course.each(assignment):
        for r in grade_rows(one):
            row = merged.setdefault(r["student"], {"student": r["student"], "state": "graded", "autograded": 0.0,
                                                   "autograded_max": 0.0, "written": 0.0, "written_max": 0.0,
                                                   "written_pending": 0})
            row.update({q: r[q] for q in r if q in EXERCISES})
            row[one.assignment] = round(r["autograded"] + r["written"], 2)
            for k in ("autograded", "autograded_max", "written", "written_max", "written_pending"):
                row[k] = round(row[k] + r[k], 2)
            if rank.get(r["state"], 0) > rank.get(row["state"], 0):
                row["state"] = r["state"]
                if r.get("error"):
                    row["error"] = f"{one.assignment}: {r['error']}"
    return [merged[s] for s in sorted(merged)]


def format_table(rows: list[dict], qids: list[str] | None = None) -> str:
    """The grade table; a student who is not (fully) graded is marked, and the reasons follow the table."""
    qids = qids or [e.id for e in EXERCISES.values() if e.function and any(e.id in r for r in rows)]
    head = f"{'student':<12}" + "".join(f"{q:>6}" for q in qids) + f"{'auto':>9}  written"
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = "".join(f"{r[q]:>6.4g}" if q in r else f"{'-':>6}" for q in qids)   # -: not returned
        written = f"{r['written_pending']} to grade" if r["written_pending"] else f"{r['written']:g}/{r['written_max']:g}"
        mark = "" if r.get("state", "graded") == "graded" else f"  {r['state'].upper()}"
        lines.append(f"{r['student']:<12}{cells}{r['autograded']:>6.4g}/{r['autograded_max']:g}  {written}{mark}")
    notes = [f"{r['student']} is {r['state']}" + (f": {r['error'][:300]}" if r.get("error") else "")
             for r in rows if r.get("state", "graded") != "graded"]
    return "\n".join(lines + ([""] + notes if notes else []))


def export_csv(course: Course, path: Path, assignment: str | None = None) -> Path:
    """Per-assignment and per-exercise grades (nbgrader's own `nbgrader export` gives one row per student
    and assignment): a column per assignment (its points), then one per exercise of it."""
    rows = course_rows(course, assignment)
    columns = [c for one in course.each(assignment)
               for c in [one.assignment, *(e.id for e in one.exercises if e.function)]]
    fields = ["student", *columns, "autograded", "autograded_max", "written", "written_max", "written_pending", "state"]
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    return path


def progress(course: Course, students: list[str] | None = None) -> dict[str, list[str]]:
    """Students by grading state: graded, running, failed, waiting (no status yet)."""
    states: dict[str, list[str]] = {"graded": [], "running": [], "failed": [], "waiting": []}
    for s in students or course.students():
        states.setdefault(grading_state(course, s)["state"], []).append(s)
    return states
