"""The sample cohort: made-up students (students.py) and their answers (mistakes.py: edits of the reference answers; answers/), the builder of their
submissions (build.py), grading them all as the tests do (grading.py) and the record of what that gives
(golden.py, tests/golden/cohort.json)."""
from .build import ROSTER, build_cohort, build_student
from .students import BY_NAME, COHORT, Student

__all__ = ["COHORT", "BY_NAME", "Student", "build_cohort", "build_student", "ROSTER"]
