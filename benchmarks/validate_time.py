"""Benchmark: how long nbgrader's Validate takes on every notebook of a complete assignment, as a student
presses it notebook after notebook (or runs `nbgrader validate` on each), on this machine's cores.

The student folder is the sample cohort's `ada` (every answer correct) with the students' nbgrader
config README recommends (c.Execute.timeout = 300). Validate runs each notebook with
NBGRADER_EXECUTION=validate: its answer cell writes answers/, and its visible check launches torchrun.

    python benchmarks/validate_time.py [--student ada] [--only q11,q12]

It also prints the size of the student's runs/ folder after the pass (what the checks leave in a home),
and, for the core assignment (q01-q10), the figure benchmarks/README.md recorded before (PREVIOUS).
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
STUDENT_CONFIG = "c = get_config()\nc.Execute.timeout = 300\n"
# benchmarks/README.md's figure for the core assignment before this session (load 11 falling to 5.5)
PREVIOUS = {"pipeline_lab": 119.0}
CORE = [f"q{n:02d}" for n in range(1, 11)]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.cohort import BY_NAME, build_student
    from lab_src.registry import EXERCISES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", default="ada")
    ap.add_argument("--only", default="", help="comma-separated exercises, e.g. q11,q12 (default: all)")
    args = ap.parse_args()
    only = [q for q in args.only.split(",") if q]
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="pp-lab-validate-") as tmp:
        folder = build_student(BY_NAME[args.student], Path(tmp))
        (folder / "nbgrader_config.py").write_text(STUDENT_CONFIG)
        total, passed = 0.0, 0
        chosen = [ex for ex in EXERCISES.values() if not only or ex.id in only]
        if only:        # the earlier notebooks are not validated: their answers as a student's would be saved
            from grader.reference import reference_sources
            (folder / "answers").mkdir(exist_ok=True)
            for q, path in reference_sources().items():
                if q not in only and q in EXERCISES and EXERCISES[q].function:
                    (folder / "answers" / EXERCISES[q].answer_file).write_text(Path(path).read_text())
        cpu_total = 0.0
        for ex in chosen:
            started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run([sys.executable, "-m", "nbgrader", "validate", ex.notebook], cwd=folder, env=env,
                                 capture_output=True, text=True, timeout=900).stdout
            took = time.monotonic() - started
            after = resource.getrusage(resource.RUSAGE_CHILDREN)     # the processes it waited for: a measure
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime    # that load does not swell
            total, cpu_total = total + took, cpu_total + cpu
            ok = "Success!" in out
            passed += ok
            verdict = "Success" if ok else next((ln for ln in out.splitlines() if ln.strip()), "(no output)")
            print(f"{ex.notebook:<32} {took:6.1f} s  (CPU {cpu:4.1f} s waited for)  {verdict}", flush=True)
        runs = sum(f.stat().st_size for f in folder.rglob("runs/**/*") if f.is_file())
        print(f"{len(chosen)} notebooks: {total:.0f} s (CPU {cpu_total:.0f} s), {passed} passed; runs/ holds {runs / 2**20:.1f} MiB; load "
              f"average now {os.getloadavg()[0]:.1f}")
        if sorted(ex.id for ex in chosen) == CORE:
            print(f"the core assignment (pipeline_lab): {total:.0f} s; before: {PREVIOUS['pipeline_lab']:.0f} s "
                  f"(ratio {total / PREVIOUS['pipeline_lab']:.2f}); target 90 s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
