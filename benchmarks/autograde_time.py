"""Benchmark: the wall time to autograde one complete submission of all ten notebooks, and how many
torchrun launches it made. The submission is the sample cohort's `ada` (every answer correct), graded
the way `python -m grader autograde` grades it; the phases are timed separately.

    python benchmarks/autograde_time.py [--student ada] [--repeat 2]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader import verdicts
    from grader.autograde import run_trusted
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course
    from lab_src.checks import GRADER_TIMELINES
    from lab_src.registry import ASSIGNMENT

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", default="ada")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="pp-lab-bench-") as tmp:
        tmp = Path(tmp)
        build_cohort(tmp / "submissions", [BY_NAME[args.student]])
        course = Course(tmp / "course")
        collect_folder(course, tmp / "submissions")
        t = time.monotonic()
        course.ensure_assignment()
        course.add_students([args.student])
        print(f"gradebook set up once per course: {time.monotonic() - t:.1f} s")
        for i in range(args.repeat):
            for sub in ("autograded", "grader"):
                shutil.rmtree(course.root / sub, ignore_errors=True)
            t0 = time.monotonic()
            result = run_trusted(course, args.student)
            t1 = time.monotonic()
            course.nbgrader("autograde", ASSIGNMENT, "--student", args.student, "--force",
                            env={GRADER_TIMELINES: str(course.root / "grader" / args.student / "work" / "timeline")})
            t2 = time.monotonic()
            given = verdicts.apply(course, args.student, result)
            t3 = time.monotonic()
            print(f"run {i + 1}: {t3 - t0:.1f} s in all = hidden tests {t1 - t0:.1f} s "
                  f"({result['cases']} cases, {result['launches']} torchrun launch(es)) + nbgrader executing "
                  f"10 notebooks {t2 - t1:.1f} s (0 launches: visible checks do not launch while autograding) "
                  f"+ gradebook {t3 - t2:.1f} s; score {sum(given.values()):g}")
        print(json.dumps({"student": args.student, "last_run_s": round(t3 - t0, 1), "launches": result["launches"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
