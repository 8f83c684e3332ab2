"""A clock for limits that must not depend on how busy the machine is: the time since a start, less the
time this thread spent waiting, ready to run, for a CPU that other processes held.

On an idle machine it reads as the wall clock. On a loaded one (a class graded 8 at a time on 2 cores, a
CI machine running the tests beside the grading) a cell that walks the disk for 10 s may take 60 s of
wall time to do it; by this clock it still took about 10 s, so the same answer gets the same verdict.
A thread that sleeps or blocks is charged for it: a cell that waits forever still reaches the limit.

Linux keeps the waiting time per thread (/proc/thread-self/schedstat: nanoseconds on a CPU, nanoseconds
waiting for one, time slices). Where that file cannot be read, the clock is the wall clock.

`OwnClock` is a rank's (worker.py, the load limit), `TreeClock` the launching process's for its ranks
(runner.py, the case deadline).
"""
from __future__ import annotations

import time


def _waited_s(schedstat: str) -> float | None:
    """Seconds the thread of a schedstat file has waited for a CPU since it started (None: gone, or not said)."""
    try:
        with open(schedstat) as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def waited_for_cpu_s() -> float | None:
    """This thread's."""
    return _waited_s("/proc/thread-self/schedstat")


class OwnClock:
    """Started when made, in the thread that reads it (the waiting time is that thread's)."""

    def __init__(self):
        self.started, self.waited_at_start = time.monotonic(), waited_for_cpu_s()

    def waited_s(self) -> float:
        """The time, since the start, this thread waited for a CPU."""
        now = waited_for_cpu_s()
        if now is None or self.waited_at_start is None:
            return 0.0
        return max(0.0, now - self.waited_at_start)

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started - self.waited_s()


def _waited_of(pid: int) -> float | None:
    """The main thread's of process `pid`."""
    return _waited_s(f"/proc/{pid}/schedstat")


class TreeClock:
    """The same clock for work done by other processes: this process's descendants (a launch's ranks,
    forked by the fork server, the warm launcher or torchrun). The time since the start, less the longest
    time one of them waited for a CPU since then (a process born since counts from its birth).

    The launch's watch reads it for the case deadline, whose work is the ranks'. Reading it scans the
    process table (a `root`'s children are read from /proc instead: `peers_clock`), so the watch reads it only
    once the wall clock is past the deadline."""

    def __init__(self, root: int | None = None):
        self.root = root            # whose descendants: this process's by default
        self.started = time.monotonic()
        self.at_start = {pid: w for pid in self._descendants() if (w := _waited_of(pid)) is not None}

    def _descendants(self) -> list[int]:
        if self.root is not None:
            found = _children(self.root)
            if found is not None:
                return found
        import psutil
        try:
            return [p.pid for p in psutil.Process(self.root).children(recursive=True)]
        except psutil.Error:
            return []

    def waited_s(self) -> float:
        waits = [w - self.at_start.get(pid, 0.0) for pid in self._descendants()
                 if (w := _waited_of(pid)) is not None]
        return max([0.0, *waits])

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started - self.waited_s()


def _children(pid: int) -> list[int] | None:
    """The children of process `pid`, from its threads' /proc children lists (a few small files: a scan of the
    whole process table, as psutil makes, takes about 0.1 s on a hub with thousands of processes, at every
    barrier of every rank); None where the kernel does not keep them."""
    import os
    try:
        out = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        return out
    except (OSError, ValueError):
        return None


def peers_clock() -> TreeClock:
    """The same clock for a rank waiting for the other ranks of its launch (a case's barrier,
    harness/case_barrier.py): the descendants of its parent (the fork server, the warm launcher or torchrun's
    agent) are the launch's ranks (its children: ranks start no processes of their own). A rank starved of CPU
    holds the others at the barrier; by this clock the wait lasts what it would on an idle machine, as the
    launch's case deadline does."""
    import os
    return TreeClock(os.getppid())

