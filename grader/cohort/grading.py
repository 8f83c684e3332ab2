"""Grade the sample cohort for real, as the tests do (tests/conftest.py, graded_cohort): build the
submissions, collect them into a fresh course with the roster, and autograde them `jobs` at a time
(nbgrader + the out-of-process hidden tests). Used by the tests and by `python -m grader.cohort golden`.
"""
from __future__ import annotations

from pathlib import Path

from ..autograde import grade_all
from ..cli import collect_folder
from ..course import Course
from ..report import grade_rows
from .build import ROSTER, build_cohort
from .students import COHORT

# Eight autogrades at once on a 2-core machine (issue 18): grading must give every student exactly the same
# points as one at a time (tests/test_cohort.py::test_one_at_a_time_gives_the_same_grades) however busy the cores.
JOBS = 8


def grade_cohort(base: Path, students=COHORT, jobs: int = JOBS):
    """Submissions in `base`/submissions, the course in `base`/course, graded: (course, results by
    student, grade rows by student)."""
    base = Path(base)
    build_cohort(base / "submissions", students)
    course = Course(base / "course")
    collect_folder(course, base / "submissions")
    course.ensure_assignment()
    course.import_roster(base / "submissions" / ROSTER)
    results = grade_all(course, [s.name for s in students], jobs=jobs)
    return course, results, {r["student"]: r for r in grade_rows(course)}
