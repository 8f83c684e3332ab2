"""The sample cohort graded in a process of its own while the other tests run (tests/conftest.py).

Grading the cohort alone keeps both cores of the CI machine busy for about eight minutes; the rest of the
suite leaves them about half idle (browsers, Slurm and the hub starting, timeouts under test: measured
with vmstat, 52 % idle outside the cohort's grading, 3 % during it). So the session starts the grading as
soon as a test that needs it is selected, and those tests run last (`graded_cohort` waits for it). With
the priority below, the machine is busy from the first minute until the cohort is graded (844 to 919 s
into the run; make test 17 to 18.5 minutes, benchmarks/README.md).

The grading process is detached from pytest (its own session, not pytest's child: the tests that check
what they leave behind look at pytest's children), writes what `grade_cohort` returns to <base>/graded.json,
and ends its whole process group when the session ends or pytest is gone. It grades at a lower
priority than the tests: `nice` 10, which its processes inherit, and, where the kernel schedules each
session as a group of its own (autogroup: a session's `nice` then counts only within it, and the grading
starts a session per sandbox, launch and kernel), a thread that gives every session it starts the group
priority 10 too (`lower_sessions`). Not 19: starved that far, its answers ran into the grader's deadlines
(a cell still loading after 60 s, a 45 s case), and two students lost points they deserve; the same
happened at 10 once in CI and once on another machine, before those deadlines were read on the ranks'
own clock (lab_src/harness/own_time.py). Run as a script, it is that process:

    python tests/cohort_in_background.py BASE --parent PID [--students ada,ivo] [--jobs 8]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from grader.cohort.grading import JOBS

ROOT = Path(__file__).resolve().parents[1]
NICE = 10
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


class Background:
    def __init__(self, base: Path, students: list[str], jobs: int = JOBS):
        self.base = Path(base)
        self.log = self.base / "grading.log"
        self.out = self.base / "graded.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), str(self.base), "--parent", str(os.getpid()),
               "--students", ",".join(students), "--jobs", str(jobs)]
        # `sh` starts the grader in the background and exits: the grader is nobody's child in this session
        launcher = subprocess.run(["sh", "-c", '"$@" </dev/null >>"$LOG" 2>&1 & echo $!', "sh", *cmd],
                                  env={**os.environ, "LOG": str(self.log), "PYTHONPATH": str(ROOT)},
                                  cwd=ROOT, capture_output=True, text=True, start_new_session=True, check=True)
        self.pid = int(launcher.stdout.split()[0])

    def alive(self) -> bool:
        try:
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE   # (not our child: not ours to reap)
        except psutil.NoSuchProcess:
            return False

    def result(self):
        """(course, results by student, grade rows by student), once the grading has ended."""
        from grader.course import Course
        while self.alive() and not self.out.exists():
            time.sleep(0.5)
        if not self.out.exists():
            raise RuntimeError(f"grading the cohort in the background failed:\n{self.log.read_text()[-5000:]}")
        done = json.loads(self.out.read_text())
        return Course(self.base / "course"), done["results"], done["rows"]

    def stop(self) -> None:
        if self.alive():
            with_group(self.pid, signal.SIGTERM)
            for _ in range(100):
                if not self.alive():
                    return
                time.sleep(0.1)
            with_group(self.pid, signal.SIGKILL)


def with_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def watch_parent(parent: int) -> None:
    """End this process group when pytest is gone (killed, say), so that nothing grades on without it."""
    while True:
        time.sleep(1)
        try:
            os.kill(parent, 0)
        except ProcessLookupError:
            os.killpg(0, signal.SIGKILL)


def lower_sessions(callers: int | None, every_s: float = 0.25) -> None:
    """Give the session of every process of this grading the scheduling priority `NICE` (Linux's
    autogroup nice, /proc/PID/autogroup), but the session `callers` (the one it was started in, when
    it could not leave it); nothing where the kernel schedules no session groups."""
    if AUTOGROUP.exists() and AUTOGROUP.read_text().strip() == "0":
        return
    me, done = psutil.Process(), set()
    while True:
        try:
            pids = {me.pid, *(c.pid for c in me.children(recursive=True))}
        except psutil.Error:
            pids = {me.pid}
        for pid in pids - done:
            try:
                if os.getsid(pid) != callers:
                    Path(f"/proc/{pid}/autogroup").write_text(str(NICE))
                done.add(pid)
            except OSError:     # gone already, or not ours
                pass
        done &= pids
        time.sleep(every_s)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("base", type=Path)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--students", default="")
    ap.add_argument("--jobs", type=int, default=JOBS)
    args = ap.parse_args(argv)
    callers = None
    try:
        os.setsid()             # a session of its own: the group priority it sets is not its caller's
    except OSError:             # already a process group's leader (started by a shell with job control)
        callers = os.getsid(0)
        os.setpgid(0, 0)
    os.nice(NICE)
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    threading.Thread(target=watch_parent, args=(args.parent,), daemon=True).start()
    threading.Thread(target=lower_sessions, args=(callers,), daemon=True).start()
    from grader.cohort import COHORT
    from grader.cohort.grading import grade_cohort
    names = [s for s in args.students.split(",") if s]
    started = time.monotonic()
    _, results, rows = grade_cohort(args.base, [s for s in COHORT if not names or s.name in names], jobs=args.jobs)
    tmp = args.base / "graded.json.tmp"
    tmp.write_text(json.dumps({"results": results, "rows": rows}))
    tmp.rename(args.base / "graded.json")
    print(f"graded {len(results)} students in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
