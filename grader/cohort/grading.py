"""Grade the sample cohort for real, as the tests do (tests/conftest.py, graded_cohort): build the
submissions, collect them into a fresh course with the roster, and autograde them `jobs` at a time
(nbgrader + the out-of-process hidden tests). Used by the tests and by `python -m grader.cohort golden`.
"""
from __future__ import annotations

from pathlib import Path

from ..autograde import grade_course
from ..cli import collect_folder
from ..course import Course
from ..report import course_rows
from .build import ROSTER, build_cohort
from .students import COHORT

# Eight autogrades at once on a 2-core machine (issue 18): grading must give every student exactly the same
# points as one at a time (tests/test_cohort.py::test_one_at_a_time_gives_the_same_grades) however busy the cores.
JOBS = 8


def grade_cohort(base: Path, students=COHORT, jobs: int = JOBS, assignment: str | None = None):
    """Submissions in `base`/submissions, the course in `base`/course (a course.toml written there first
    chooses its modules), graded: (course, results by student, grade rows by student over its assignments)."""
    base = Path(base)
    build_cohort(base / "submissions", students)
    (base / "course").mkdir(parents=True, exist_ok=True)    # made by the first submission collected, if any
    course = Course(base / "course", assignment=assignment)
    for one in course.each(assignment):   # every assignment of the course (its course.toml), or `assignment`
        collect_folder(one, base / "submissions")
        one.ensure_assignment()
    course.import_roster(base / "submissions" / ROSTER)
    results = grade_course(course, [s.name for s in students], jobs=jobs, assignment=assignment)
    return course, results, {r["student"]: r for r in course_rows(course, assignment)}
