"""Benchmark: the wall time to autograde one complete submission, and what the sandbox costs.
The submission is the sample cohort's `ada` (every answer correct), graded by
`grader.autograde.grade_student`, exactly as `python -m grader autograde` grades it: in the sandbox
(bubblewrap, the fork server running the cases in groups that never hold the graded exercise's
reference), and, for comparison, with `--unsafe-no-sandbox` (one plain torchrun launch, every
reference answer beside the student's code; nbgrader's kernels unsandboxed), and sandboxed with a
sandbox started per kernel instead of the kernels' fork server (LAB_KERNEL_NO_FORK_SERVER=1: what the
fork server saves). Runs alternate, so all see the same machine load.

    python benchmarks/autograde_time.py [--student ada] [--repeat 2] [--sandboxed-only]

Each figure is printed beside the one benchmarks/README.md recorded before (PREVIOUS: 2 idle cores, before
the perturbed baselines took a rank's threads and before one kernels' fork server served a whole student).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# benchmarks/README.md's figures for ada's core assignment, best of 2, idle, before this session's changes
# (the hidden tests were recorded only as "13.4 to 14.6 s every way")
PREVIOUS = {"sandbox": {"hidden_tests": 14.6, "nbgrader": 19.7, "wall": 34.2},
            "no sandbox": {"hidden_tests": 14.6, "nbgrader": 34.3, "wall": 48.9},
            "kernel sandboxes": {"hidden_tests": 14.6, "nbgrader": 37.4, "wall": 50.9}}


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.autograde import grade_student
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course
    from grader.kernel_sandbox import NO_ZYGOTE

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", default="ada")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--assignment", default="pipeline_lab", help="the assignment graded (a course module)")
    ap.add_argument("--sandboxed-only", action="store_true", help="only the way grading runs (no comparisons)")
    args = ap.parse_args()
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="pp-lab-bench-") as tmp:
        tmp = Path(tmp)
        build_cohort(tmp / "submissions", [BY_NAME[args.student]])
        course = Course(tmp / "course", assignment=args.assignment)
        collect_folder(course, tmp / "submissions")
        t = time.monotonic()
        course.ensure_assignment()
        course.add_students([args.student])
        print(f"gradebook set up once per course: {time.monotonic() - t:.1f} s")
        modes = (("sandbox", False, "0"), ("no sandbox", True, "0"), ("kernel sandboxes", False, "1"))
        modes = modes[:1] if args.sandboxed_only else modes
        phases = {mode: {"hidden_tests": [], "nbgrader": [], "wall": []} for mode, _, _ in modes}
        for i in range(args.repeat):
            for mode, unsafe, no_fork_server in modes:
                for sub in (course.root / "autograded", course.grading_root):
                    shutil.rmtree(sub, ignore_errors=True)
                os.environ[NO_ZYGOTE] = no_fork_server
                out = grade_student(course, args.student, unsafe_no_sandbox=unsafe)
                ph = out["phases_s"]
                for name, value in (*ph.items(), ("wall", out["wall_s"])):
                    phases[mode].setdefault(name, []).append(value)
                print(f"run {i + 1}, {mode:>16}: {out['wall_s']:.1f} s in all = hidden tests "
                      f"{ph['hidden_tests']:.1f} s ({out['cases']} cases, {out['launches']} launch(es)) + nbgrader "
                      f"executing the notebooks {ph['nbgrader']:.1f} s (visible checks do not launch while "
                      f"autograding) + gradebook {ph['gradebook']:.1f} s; score {sum(out['scores'].values()):g}")
        best = {mode: {name: min(v) for name, v in by.items()} for mode, by in phases.items()}
        for name in ("hidden_tests", "nbgrader", "wall"):
            for mode in best:
                before = PREVIOUS[mode][name] if args.student == "ada" and args.assignment == "pipeline_lab" else None
                print(f"{name:>12}, {mode:>16}, best of {args.repeat}: {best[mode][name]:.1f} s"
                      + (f" (before: {before:.1f} s, ratio {best[mode][name] / before:.2f})" if before else ""))
            if len(best) == 3:
                on, off = best["sandbox"][name], best["no sandbox"][name]
                per_kernel = best["kernel sandboxes"][name]
                print(f"{name:>12}: the sandbox adds {on - off:+.1f} s; a sandbox per kernel instead of the kernels' "
                      f"fork server {per_kernel - on:+.1f} s")
        print(f"load average now {os.getloadavg()[0]:.1f}")
        print(json.dumps({"student": args.student, "best_s": best}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
