"""python -m grader.cohort [OUT_DIR]: write the cohort's submissions (build.py, default out/cohort);
python -m grader.cohort golden [--write] [--course DIR]: grade it and compare with its record (golden.py)."""
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if argv[:1] == ["golden"]:
        from .golden import main as golden
        return golden(argv[1:])
    if argv[:1] and argv[0].startswith("-"):
        print(__doc__)
        return 0 if argv[0] in ("-h", "--help") else 2
    from .build import build_cohort
    for path in build_cohort(Path(argv[0] if argv else "out/cohort")):
        print(path)
    return 0


sys.exit(main(sys.argv[1:]))
