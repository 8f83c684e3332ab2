"""The instructor side of the lab: reference answers, hidden tests, nbgrader glue, cohort tools.

Nothing here ships to students: `pip install .` installs lab_src only.
"""
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent          # the repository
SOURCE = ROOT / "solutions"                              # nbgrader source notebooks (reference answers)
RELEASE = ROOT / "notebooks"                             # the generated student release
