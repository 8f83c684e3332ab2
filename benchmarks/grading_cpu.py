"""Benchmark: what grading some of the sample cohort costs in CPU, every process of it counted (the
sandboxed ranks and kernels included), beside the same grading by an earlier checkout.

    python benchmarks/grading_cpu.py [--students ada,ivo,wren,zeno] [--tree OLD_CHECKOUT]

The students are graded as the tests grade the cohort (grader/cohort/grading.py, 8 at a time, every
assignment). CPU is read from a cpuacct cgroup made for the run (cgroup v1, as root); elsewhere from the
processes the run waited for (which misses what sandboxes' own init processes reap). On a shared machine
CPU, not the wall time, is what compares: both are printed, with the load. The figure includes setting
the course up (the submissions, collecting them, nbgrader's generate_assignment of every assignment): 39 CPU s
for `untouched` alone, whose grading runs no case; compare runs of the same students. `--tree` grades the same
students with another checkout (say `git archive c9592ba | tar -x -C /tmp/old`) first, then this one.
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CGROUPS = Path("/sys/fs/cgroup/cpuacct")
GRADE = ("import sys; from pathlib import Path; from grader.cohort import BY_NAME; "
         "from grader.cohort.grading import grade_cohort; "
         "c, r, rows = grade_cohort(Path(sys.argv[1]), [BY_NAME[n] for n in sys.argv[2].split(',')]); "
         "print({s: round(sum(v for q, v in rows[s].items() if q.startswith('q') and isinstance(v, float)), 2) for s in rows})")


def grade(tree: Path, students: str) -> tuple[float, float, str, str]:
    """(CPU s, wall s, how CPU was counted, the points printed) of grading `students` with `tree`."""
    group = CGROUPS / f"pp-lab-bench-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        group = None
    with tempfile.TemporaryDirectory(prefix="pp-lab-cpu-") as tmp:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
        pre = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
        out = subprocess.run([sys.executable, "-c", GRADE, tmp, students], cwd=tree, env=env, capture_output=True,
                             text=True, preexec_fn=pre, timeout=3600)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if group:
        cpu, how = int((group / "cpuacct.usage").read_text()) / 1e9, "cgroup"
        group.rmdir()
    else:
        cpu, how = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, "waited-for processes"
    return cpu, wall, how, (out.stdout.strip().splitlines() or [out.stderr[-500:]])[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--students", default="ada,ivo,wren,zeno")
    ap.add_argument("--tree", type=Path, help="an earlier checkout, graded first for comparison")
    args = ap.parse_args()
    n = len(args.students.split(","))
    runs = [("earlier", args.tree.resolve())] if args.tree else []
    figures = {}
    for name, tree in runs + [("this checkout", ROOT)]:
        load = os.getloadavg()[0]
        cpu, wall, how, points = grade(tree, args.students)
        figures[name] = cpu
        print(f"{name:>13}: {cpu:.1f} CPU s ({cpu / n:.1f} a student, {how}), wall {wall:.0f} s, load {load:.1f} -> "
              f"{os.getloadavg()[0]:.1f}; total points {points}", flush=True)
    if len(figures) == 2:
        print(f"ratio this / earlier: {figures['this checkout'] / figures['earlier']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
