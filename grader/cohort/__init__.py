"""The sample cohort of made-up students (students.py) and the builder of their submissions (build.py)."""
from .build import ROSTER, build_cohort, build_student
from .students import BY_NAME, COHORT, Student

__all__ = ["COHORT", "BY_NAME", "Student", "build_cohort", "build_student", "ROSTER"]
