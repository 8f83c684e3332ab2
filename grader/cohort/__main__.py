import sys
from pathlib import Path

from .build import build_cohort

for path in build_cohort(Path(sys.argv[1] if len(sys.argv) > 1 else "out/cohort")):
    print(path)
