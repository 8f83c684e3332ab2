"""Whether the processes a rank descends from are being killed: what lets the grader blame the answer that
killed them, every time, rather than whichever case a rank reached before the kill took effect.

A rank's parent is the elastic agent that forked it (or torchrun), and the agent's parent the fork server
of the sandbox (or the warm launcher of the visible checks; harness/elastic.py). An answer that kills one
of them ends the rank too (PR_SET_PDEATHSIG, or the sandbox's PID namespace ending), but not at once: the
signal takes effect a moment later, and meanwhile the rank goes on, finishes the calls of a quick case,
saves what it observed, or marks the answer as loaded and starts loading the next. Which of these it got
to was a race, so a killing answer's points varied between gradings. The worker asks `dying` after each
answer it loads and after each case: when an ancestor is being killed, the rank records nothing more and
waits for its end (`await_end`), so that its journal ends at the answer that killed it.

A process is being killed when it is gone, a zombie, exiting (PF_EXITING), or has a SIGKILL pending (a
signal sent but not yet acted on). An answer that only asks its ancestors to stop (SIGTERM) is not seen
here: the agent then stops the ranks itself, as torchrun does.
"""
from __future__ import annotations

import os
import time

PF_EXITING = 0x4
SIGKILL_BIT = 1 << 8            # signal 9 in /proc's pending masks


def ancestors(depth: int = 2) -> list[int]:
    """This process's parent, the parent's parent... (`depth` of them, fewer where the chain ends at 1)."""
    chain, pid = [], os.getpid()
    for _ in range(depth):
        pid = _parent(pid)
        if pid is None or pid <= 1:
            break
        chain.append(pid)
    return chain


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _being_killed(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X", "x") or int(fields[6]) & PF_EXITING:
            return True
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & SIGKILL_BIT:
                    return True
    except FileNotFoundError:
        return True
    except (OSError, ValueError, IndexError):
        return False
    return False


def dying(chain: list[int]) -> bool:
    """True when a process of `chain` (from `ancestors()`, taken when the rank started) is being killed."""
    if not chain:
        return False
    if os.getppid() != chain[0]:            # the parent has already exited: this rank was reparented
        return True
    return any(_being_killed(pid) for pid in chain)


def await_end(limit_s: float = 5.0) -> None:
    """Wait for the kill to reach this process; after `limit_s` (it did not: a false alarm), go on."""
    until = time.monotonic() + limit_s
    while time.monotonic() < until:
        time.sleep(0.05)
