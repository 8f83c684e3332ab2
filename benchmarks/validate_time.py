"""Benchmark: how long nbgrader's Validate takes on every notebook of a complete assignment, as a student
presses it notebook after notebook (or runs `nbgrader validate` on each), on this machine's cores.

The student folder is the sample cohort's `ada` (every answer correct) with the students' nbgrader
config README recommends (c.Execute.timeout = 300). Validate runs each notebook with
NBGRADER_EXECUTION=validate: its answer cell writes answers/, and its visible check launches torchrun.

    python benchmarks/validate_time.py [--student ada]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STUDENT_CONFIG = "c = get_config()\nc.Execute.timeout = 300\n"


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.cohort import BY_NAME, build_student
    from lab_src.registry import EXERCISES
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--student", default="ada")
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("NBGRADER_EXECUTION", "LAB_ANSWERS", "LAB_ANSWERS_DIR")}
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="pp-lab-validate-") as tmp:
        folder = build_student(BY_NAME[args.student], Path(tmp))
        (folder / "nbgrader_config.py").write_text(STUDENT_CONFIG)
        total, passed = 0.0, 0
        for ex in EXERCISES.values():
            started = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "nbgrader", "validate", ex.notebook], cwd=folder, env=env,
                                 capture_output=True, text=True, timeout=900).stdout
            took = time.monotonic() - started
            total += took
            ok = "Success!" in out
            passed += ok
            verdict = "Success" if ok else next((ln for ln in out.splitlines() if ln.strip()), "(no output)")
            print(f"{ex.notebook:<32} {took:6.1f} s  {verdict}", flush=True)
        print(f"all {len(EXERCISES)} notebooks: {total:.0f} s, {passed} passed; load average now "
              f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
