"""A fork server for sandboxed grading: one process imports torch once, then forks the ranks of each
group of cases on command, and clears the sandbox between groups.

    python -m lab_src.harness.zygote        # inside the sandbox; commands on stdin, replies on stdout

The grader (harness/runner.py) starts it in a bubblewrap sandbox and sends one line per group:

    GROUP <spec.json> <nproc>       ->   DONE <json: {rank: exit status}>

For a group, the zygote forks torch's elastic agent (the code torchrun runs; harness/elastic.py), which
forks `nproc` ranks of a fresh `torch.distributed` job on loopback that run the group's cases
(`harness/worker.py`, as for the visible checks). When every child has exited, it kills every other process left in the sandbox's PID namespace
(whatever a student's code started, in whatever session), and only then answers. The grader writes a
group's inputs (answer files, baselines) into the run folder just before the GROUP line and deletes
them after the DONE line, so a group never sees another group's inputs: this is what keeps the
reference answer of the exercise being graded out of reach of the student's code (runner.py groups
the cases so that it never is among a group's inputs).

The agent closes every inherited descriptor but its log and the pipe its ranks' exit statuses go back
on, which the ranks close first thing; the zygote makes itself
non-dumpable, so a child can neither read its pipes through /proc nor trace it.
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import time


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
    """The group's ranks, started by torch's elastic agent as torchrun would (harness/elastic.py)."""
    from lab_src.harness import elastic
    run_dir = json.loads(open(spec_path).read())["run_dir"]
    pid, read_end = elastic.start(spec_path, nproc, run_dir=run_dir,
                                  log_path=os.path.join(run_dir, "torchrun.log"))     # the groups' in turn
    agent_status, status = elastic.collect(pid, read_end)
    if not status and agent_status:                 # the agent itself failed: every rank counts as failed
        status = {r: agent_status for r in range(nproc)}
    clear_namespace(keep)
    return status


def hand_out_diag(argv: list[str]) -> None:
    """`--diag-fd N`: send the grader, over descriptor N, a sock_diag socket of this sandbox's network namespace
    (harness/wire.py), before any answer is loaded, and keep nothing of it."""
    if "--diag-fd" not in argv:
        return
    import socket
    channel = socket.socket(fileno=int(argv[argv.index("--diag-fd") + 1]))
    try:
        from lab_src.harness.wire import open_diag
        diag = open_diag()
        socket.send_fds(channel, [b"diag"], [diag.fileno()])
        diag.close()
    except OSError:
        pass
    finally:
        channel.close()


def main() -> int:
    non_dumpable()
    hand_out_diag(sys.argv)
    from lab_src.harness import elastic
    elastic.preload()       # torch and the rank's code, imported once, before any answer; never CUDA
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
