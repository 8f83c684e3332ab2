"""The instructor side of the lab: reference answers, hidden tests, nbgrader glue, cohort tools.

Nothing here ships to students: `pip install .` installs lab_src only.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent          # the repository
SOURCE = ROOT / "solutions"                              # nbgrader source notebooks (reference answers)
RELEASE = ROOT / "notebooks"                             # the generated student release

# nbgrader's Gradebook runs the `alembic` command of its environment; make sure it is found even when
# the environment is used without being activated (.venv/bin/python -m grader ...).
_bin = str(Path(sys.executable).parent)
if _bin not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join([_bin, os.environ.get("PATH", "")])
