"""What one visible check costs a hub user: wall time, processes, memory, under 1 and 2 cores.

    sudo .venv/bin/python benchmarks/hub_check_cost.py [--qid q08] [--cpus 0 0-1] [--repeat 3]

Runs `check(qid)` as an unprivileged user (nobody) with the single-user environment's Python, in a
folder holding the reference answers of the exercises it needs, pinned to the given cores with
taskset, exactly as a kernel of a JupyterLab server started under `taskset` (hub/localhub.py --cpus)
or in a container limited to that many CPUs would run it. The core settings alternate run by run, so
that a change in the machine's load touches both alike. Samples the process tree every 50 ms:
how many processes the check had at once (the kernel's python, torchrun, its workers) and their
summed resident memory. Prints a table and the load average; hub/README.md quotes it.
"""
from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "hub"))


def measure(python: Path, folder: Path, qid: str, cpus: str, user: str) -> dict:
    pw = pwd.getpwnam(user)
    cmd = ["taskset", "-c", cpus, "setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", "--",
           str(python), "-c", f"from lab_src.checks import check; check({qid!r})"]
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(folder), "LAB_OMP_THREADS": "1", "LANG": "C.UTF-8"}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    top = psutil.Process(proc.pid)
    most_procs, most_rss = 0, 0
    while proc.poll() is None:
        try:
            tree = [top, *top.children(recursive=True)]
            rss = 0
            for p in tree:
                try:
                    rss += p.memory_info().rss
                except psutil.Error:
                    pass
            most_procs, most_rss = max(most_procs, len(tree)), max(most_rss, rss)   # taskset and setpriv exec python
        except psutil.Error:
            pass
        time.sleep(0.05)
    out = proc.stdout.read().decode(errors="replace")
    wall = time.monotonic() - started
    if proc.returncode != 0 or "all checks passed" not in out:
        raise RuntimeError(f"the check failed:\n{out[-3000:]}")
    return {"wall_s": wall, "procs": most_procs, "rss_mb": most_rss / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qid", nargs="+", default=["q05", "q08"])
    ap.add_argument("--cpus", nargs="+", default=["0", "0-1"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--user", default="nobody")
    args = ap.parse_args(argv)
    from grader.reference import reference_sources
    from lab_src.registry import EXERCISES
    from localhub import build_environment
    python = build_environment() / "venv" / "bin" / "python"
    folder = Path("/var/tmp/pp-lab-measure")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "answers").mkdir(parents=True)
    for qid, path in reference_sources().items():
        shutil.copyfile(path, folder / "answers" / EXERCISES[qid].answer_file)
    pw = pwd.getpwnam(args.user)
    for p in [folder, *folder.rglob("*")]:
        os.chown(p, pw.pw_uid, pw.pw_gid)
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'check':<6} {'cores':<6} {'wall s (median of ' + str(args.repeat) + ')':<24} {'processes':<10} peak RSS MB")
    try:
        for qid in args.qid:
            runs = {cpus: [] for cpus in args.cpus}
            for _ in range(args.repeat):
                for cpus in args.cpus:          # alternate: the machine's load changes for both alike
                    runs[cpus].append(measure(python, folder, qid, cpus, args.user))
            for cpus, got in runs.items():
                print(f"{qid:<6} {cpus:<6} {statistics.median(r['wall_s'] for r in got):<24.1f} "
                      f"{max(r['procs'] for r in got):<10} {max(r['rss_mb'] for r in got):.0f}", flush=True)
        print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
