"""Benchmark: the wall time to autograde one complete submission of all ten notebooks, and how many
torchrun launches it made. The submission is the sample cohort's `ada` (every answer correct), graded
by `grader.autograde.grade_student`, exactly as `python -m grader autograde` grades it.

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
    from grader.autograde import grade_student
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course

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
            out = grade_student(course, args.student)
            ph = out["phases_s"]
            print(f"run {i + 1}: {out['wall_s']:.1f} s in all = hidden tests {ph['hidden_tests']:.1f} s "
                  f"({out['cases']} cases, {out['launches']} torchrun launch(es)) + nbgrader executing 10 notebooks "
                  f"{ph['nbgrader']:.1f} s (0 launches: visible checks do not launch while autograding) "
                  f"+ gradebook {ph['gradebook']:.1f} s; score {sum(out['scores'].values()):g}")
        print(json.dumps({"student": args.student, "last_run_s": out["wall_s"], "launches": out["launches"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
