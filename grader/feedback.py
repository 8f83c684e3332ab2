"""Feedback for every returned submission, or a loud reason why not.

`nbgrader generate_feedback` writes course/feedback/<student>/pipeline_lab/<notebook>.html from the
autograded notebooks; it says nothing about a student it had nothing for (one whose autograde failed).
Here every returned submission is then checked against nbgrader's own view (grader/formgrader_view.py),
and each student without feedback for every autograded notebook is returned with the reason.
"""
from __future__ import annotations


from .course import Course
from .formgrader_view import problems


# nbgrader's feedback page carries bootstrap's reset (td, th {padding: 0}) and no table style of its own: the
# notebooks' tables ran together ("all-reduceidentity" for q17's f/g table) and wide figures ran off the page
STYLE = ("<style id=\"lab-feedback\">.rendered_html table, table {margin: .6em 0; border-collapse: collapse} "
         "td, th {padding: 3px 12px !important; border: 1px solid #ccc} "
         "img {max-width: 100%; height: auto}</style>")


def styled(html) -> None:
    """Add the lab's few rules to one feedback page (once)."""
    text = html.read_text()
    if 'id="lab-feedback"' not in text and "</head>" in text:
        html.write_text(text.replace("</head>", STYLE + "\n</head>", 1))


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
    for student in students or course.students():
        for html in course.feedback(student).glob("*.html"):
            styled(html)
    missing = problems(course, students)
    if "" in errors:   # the run for everybody failed: the students it left out are in `missing`
        for student in missing:
            missing[student] += f"; nbgrader generate_feedback: {errors['']}"
    for student, why in errors.items():
        if student and student not in missing:
            missing[student] = f"nbgrader generate_feedback failed: {why}"
    return missing
