"""The course through nbgrader's exchange (a JupyterHub, students using the Assignments panel).

The grader's own `release`, `collect --from/--zip` and `feedback` work on folders; on a hub the
assignment travels through nbgrader's exchange instead. These wrap nbgrader's exchange commands:

    python -m grader release --exchange        generate_assignment, then release_assignment
    python -m grader collect --exchange        collect (the latest submission of each student), then
                                               record them; prints each student's submissions and any
                                               missing, renamed or extra notebook
    python -m grader feedback --release        generate_feedback, then release_feedback

The exchange folder is nbgrader's `Exchange.root` from its usual config files (on the lab's hub:
$JUPYTER_CONFIG_PATH/nbgrader_config.py), or `--exchange DIR`.
"""
from __future__ import annotations

import re
from pathlib import Path


from .course import COURSE_ID, Course


def exchange_args(root: str | None) -> list[str]:
    return [f"--Exchange.root={Path(root).resolve()}"] if root else []


def release(course: Course, root: str | None = None) -> str:
    """solutions/ -> notebooks/ (recording the assignment in the gradebook), then into the exchange."""
    course.generate_release()
    proc = course.nbgrader("release_assignment", course.assignment, "--force", *exchange_args(root))
    return proc.stdout + proc.stderr


def inbound(course: Course, root: str | None = None) -> dict[str, list[str]]:
    """{student: [timestamps of their submissions, oldest first]} in the exchange's inbound folder,
    as `nbgrader list --inbound` reports them (it logs one line per submission)."""
    proc = course.nbgrader("list", "--inbound", course.assignment, *exchange_args(root))
    line = re.compile(rf"\] {re.escape(COURSE_ID)} (\S+) {re.escape(course.assignment)} (\d{{4}}-\d\d-\d\d [\d:.]+ ?\S*)")
    out: dict[str, list[str]] = {}
    for m in line.finditer(proc.stdout + "\n" + proc.stderr):
        out.setdefault(m.group(1), []).append(m.group(2).replace(" (no", "").strip())
    return {s: sorted(t) for s, t in out.items()}


def notebook_problems(course: Course, folder: Path) -> list[str]:
    """What differs from the release in one submission: missing, renamed or extra notebooks."""
    expected = {e.notebook for e in course.exercises}
    present = {p.name for p in folder.glob("*.ipynb")}
    problems = []
    for name in sorted(expected - present):
        problems.append(f"{name} is missing (scored 0)")
    for name in sorted(present - expected):
        problems.append(f"{name} is not a notebook of the assignment (renamed or extra?): not graded")
    return problems


def collect(course: Course, root: str | None = None) -> list[str]:
    """nbgrader collect --update: each student's latest submission into course/submitted/; the earlier
    ones stay in the exchange. Returns the students collected; prints what the instructor should know."""
    history = inbound(course, root)
    if not history and not course.students():   # nobody submitted this assignment (yet): nothing to collect
        print(f"  {course.assignment}: no submissions in the exchange")
        return []
    proc = course.nbgrader("collect", course.assignment, "--update", *exchange_args(root))
    for line in (proc.stdout + proc.stderr).splitlines():
        if "cheating attempt" in line or "claims to be submitted" in line:
            print(f"  WARNING (nbgrader): {line.strip()}")
    students = course.students()
    course.ensure_assignment()
    course.add_students(students)
    for student in students:
        folder = course.submitted(student)
        stamp = (folder / "timestamp.txt").read_text().strip() if (folder / "timestamp.txt").exists() else "?"
        times = history.get(student, [])
        note = f"{len(times)} submission{'s' if len(times) != 1 else ''} in the exchange" + \
               (", the latest counts" if len(times) > 1 else "")
        print(f"  {student:<14} submitted {stamp} ({note})")
        for problem in notebook_problems(course, folder):
            print(f"      {problem}")
    return students


def release_feedback(course: Course, root: str | None = None) -> str:
    proc = course.nbgrader("release_feedback", course.assignment, *exchange_args(root))
    return proc.stdout + proc.stderr
