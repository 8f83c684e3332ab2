"""A fork server for sandboxed grading: one process imports torch once, then forks the ranks of each
group of cases on command, and clears the sandbox between groups.

    python -m lab_src.harness.zygote        # inside the sandbox; commands on stdin, replies on stdout

The grader (harness/runner.py) starts it in a bubblewrap sandbox and sends one line per group:

    GROUP <spec.json> <nproc>       ->   DONE <json: {rank: exit status}>

For a group, the zygote forks `nproc` children, each a rank of a fresh `torch.distributed` job on
loopback that runs the group's cases (`harness/worker.py`, the same code torchrun runs for the visible
checks). When every child has exited, it kills every other process left in the sandbox's PID namespace
(whatever a student's code started, in whatever session), and only then answers. The grader writes a
group's inputs (answer files, baselines) into the run folder just before the GROUP line and deletes
them after the DONE line, so a group never sees another group's inputs: this is what keeps the
reference answer of the exercise being graded out of reach of the student's code (runner.py groups
the cases so that it never is among a group's inputs).

Children close every inherited descriptor but their own log files; the zygote makes itself
non-dumpable, so a child can neither read its pipes through /proc nor trace it.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def non_dumpable() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(4, 0)     # PR_SET_DUMPABLE, 0
    except OSError:
        pass


def clear_namespace(keep: set[int], spare=None) -> int:
    """SIGKILL every process of this PID namespace but `keep` (and those `spare(pid)` is true of);
    return how many there were."""
    killed = 0
    for _ in range(20):
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in keep
                and not (spare and spare(int(p)))]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        while True:                     # reap the ones that were our children
            try:
                if os.waitpid(-1, os.WNOHANG) == (0, 0):
                    break
            except ChildProcessError:
                break
        time.sleep(0.02)
    return killed


def _run_group(spec_path: str, nproc: int, keep: set[int]) -> dict:
    port = _free_port()
    children = {}
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            try:
                os.closerange(3, 1 << 16)
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)     # the worker sends its own output to its rank log at once
                os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                                   "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "GROUP_RANK": "0", "ROLE_RANK": str(rank)})
                from lab_src.harness import worker
                code = worker.main(spec_path)
            except BaseException:       # noqa: BLE001 - whatever happened, this process ends here
                code = 70
            os._exit(code or 0)
        children[pid] = rank
    status = {}
    while children:
        pid, raw = os.wait()
        if pid in children:
            status[children.pop(pid)] = os.waitstatus_to_exitcode(raw)
    clear_namespace(keep)
    return status


def main() -> int:
    non_dumpable()
    import torch  # noqa: F401 - imported once here, so that every rank forked later starts at once
    import torch.distributed  # noqa: F401

    from lab_src.harness import kinds, worker  # noqa: F401 - the rank's code, loaded before any answer
    kinds.runners()
    keep = {os.getpid(), 1}
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    replies.write("READY\n")
    for line in sys.stdin:
        parts = line.split()
        if len(parts) != 3 or parts[0] != "GROUP":
            break
        status = _run_group(parts[1], int(parts[2]), keep)
        replies.write("DONE " + json.dumps(status) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    os._exit(code)
