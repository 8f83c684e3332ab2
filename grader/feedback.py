"""Feedback for every returned submission, or a loud reason why not.

`nbgrader generate_feedback` writes course/feedback/<student>/pipeline_lab/<notebook>.html from the
autograded notebooks; it says nothing about a student it had nothing for (one whose autograde failed).
Here every returned submission is then checked against nbgrader's own view (grader/formgrader_view.py),
and each student without feedback for every autograded notebook is returned with the reason.
"""
from __future__ import annotations


from .course import Course
from .formgrader_view import problems


def generate_feedback(course: Course, students: list[str] | None = None) -> dict[str, str]:
    """Run nbgrader generate_feedback (for `students`, or everybody in one run); return {student: why
    they have no complete feedback}, empty when everybody has it."""
    errors = {}
    runs = [["--student", s] for s in students] if students else [[]]
    for extra in runs:
        proc = course.nbgrader("generate_feedback", course.assignment, "--force", *extra, check=False)
        if proc.returncode != 0:
            lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "ERROR" in ln]
            errors[extra[1] if extra else ""] = lines[-1][:300] if lines else f"exit {proc.returncode}"
    missing = problems(course, students)
    if "" in errors:   # the run for everybody failed: the students it left out are in `missing`
        for student in missing:
            missing[student] += f"; nbgrader generate_feedback: {errors['']}"
    for student, why in errors.items():
        if student and student not in missing:
            missing[student] = f"nbgrader generate_feedback failed: {why}"
    return missing
