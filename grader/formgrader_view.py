"""The course as nbgrader's own views show it: the formgrader's Manage Submissions page and the feedback.

The grade table (grader/report.py) reads the gradebook row by row; this module asks nbgrader's
formgrader API (`NbGraderAPI.get_submissions`, what the Manage Submissions page lists) whether each
returned submission is autograded, with its score and the student's name, and looks for the feedback
`nbgrader generate_feedback` wrote for each of its notebooks. `problems()` says, per student, what
nbgrader's view lacks; the demo and tests/test_cohort.py require it to be empty.
"""
from __future__ import annotations

import json


from .course import COURSE_ID, Course


def api(course: Course):
    """nbgrader's formgrader API on this course, configured by the course's nbgrader_config.py."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config
    from traitlets.config.loader import PyFileConfigLoader
    course.write_config()
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course.root)).load_config()
    config.merge(Config({"CourseDirectory": {"root": str(course.root)}}))
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def submissions(course: Course) -> dict[str, dict]:
    """{student: what Manage Submissions shows}: autograded, score, max_score, first_name, last_name,
    needs_manual_grade, plus `feedback` (the notebooks with an HTML feedback file) and `notebooks`
    (the notebooks nbgrader autograded)."""
    shown = {s["student"]: s for s in api(course).get_submissions(course.assignment)}
    for student, sub in shown.items():
        sub["notebooks"] = sorted(p.stem for p in course.autograded(student).glob("*.ipynb"))
        sub["feedback"] = sorted(p.stem for p in course.feedback(student).glob("*.html"))
    return shown


def status_of(course: Course, student: str) -> dict:
    path = course.grading_dir(student) / "status.json"
    return json.loads(path.read_text()) if path.exists() else {}


def problems(course: Course, students: list[str] | None = None, feedback: bool = True) -> dict[str, str]:
    """{student: what nbgrader's view lacks} for every returned submission (empty when all is well):
    not autograded in nbgrader's eyes, no score, a notebook without an autograded copy, no feedback."""
    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        expected = sorted(nb.name for nb in gb.find_assignment(course.assignment).notebooks)
    shown = submissions(course)
    found = {}
    for student in students or course.students():
        sub = shown.get(student)
        failed = status_of(course, student).get("error")
        why = f" ({failed})" if failed else ""
        if sub is None or not sub.get("autograded"):
            found[student] = "the formgrader shows it as not autograded (needs autograding)" + why
        elif sub.get("max_score", 0) <= 0:
            found[student] = "nbgrader's gradebook holds no scores for it" + why
        elif missing := [nb for nb in expected if nb not in sub["notebooks"] and
                         (course.submitted(student) / f"{nb}.ipynb").exists()]:
            found[student] = f"no autograded copy of {', '.join(missing)}" + why
        elif feedback and (missing := [nb for nb in sub["notebooks"] if nb not in sub["feedback"]]):
            found[student] = f"no feedback for {', '.join(missing)}" + why
    return found


def describe(course: Course, students: list[str] | None = None) -> str:
    """One line per student as the formgrader lists them."""
    shown = submissions(course)
    lines = []
    for student in students or course.students():
        s = shown.get(student, {})
        name = " ".join(filter(None, [s.get("first_name"), s.get("last_name")])) or "(no name)"
        state = "autograded" if s.get("autograded") else "needs autograding"
        lines.append(f"  {student:<12} {name:<22} {state:<18} score {s.get('score', 0):g} / {s.get('max_score', 0):g}"
                     f"  feedback {len(s.get('feedback', []))}/{len(s.get('notebooks', []))} notebooks")
    return "\n".join(lines)
