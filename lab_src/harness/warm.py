"""The warm launcher of the visible checks: a process that has imported torch and the harness once, and
starts the ranks of each check under torch's elastic agent (harness/elastic.py).

    python -m lab_src.harness.warm          # started by harness/warm_launch.py; commands on stdin

    LAUNCH <json: spec, nproc, run_dir, env>  ->  STARTED <agent pid>  ...  DONE <json: codes, swept>

One launch at a time. The process is a child subreaper: whatever a rank starts and leaves behind comes
back to it, and once the agent has ended it kills every process it still has, so nothing outlives a
launch. It dies with the process that started it (PR_SET_PDEATHSIG), and the agent and ranks die with
it. It never runs student code itself, and never initialises CUDA.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time


def _subreaper() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(36, 1)     # PR_SET_CHILD_SUBREAPER
    except OSError:
        pass


def sweep() -> int:
    """SIGKILL every process this one still has (its children and theirs); reap them; return how many."""
    import psutil
    killed = 0
    for _ in range(20):
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.kill()
                killed += 1
            except psutil.Error:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break
        if not procs:
            break
        time.sleep(0.01)
    return killed


def main() -> int:
    from lab_src.harness import elastic
    elastic.die_with_parent()
    parent = os.environ.get("LAB_WARM_PARENT")
    if parent and int(parent) != os.getppid():      # the parent died before PR_SET_PDEATHSIG took
        return 1
    _subreaper()
    elastic.preload()
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    replies.write(f"READY {os.getpid()}\n")
    for line in sys.stdin:
        word, _, rest = line.partition(" ")
        if word != "LAUNCH":
            break
        job = json.loads(rest)
        pid, read_end = elastic.start(job["spec"], job["nproc"], run_dir=job["run_dir"],
                                      log_path=job["log"], env=job.get("env"), run_id=job.get("run_id"))
        replies.write(f"STARTED {pid}\n")
        status, codes = elastic.collect(pid, read_end)
        swept = sweep()
        replies.write("DONE " + json.dumps({"status": status, "codes": codes, "swept": swept}) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)
