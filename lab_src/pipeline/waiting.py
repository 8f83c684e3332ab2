"""Waiting for a message in a way that the check can stop.

A gloo receive blocks in C++ until its message arrives or the process group's timeout expires, and
a timed-out wait closes the connection, so it cannot be polled. When the process that launched a
check sees that every rank of a case is waiting for a message nobody will send (harness/deadlock.py),
it asks the ranks to stop. To hear that request while blocked, a rank waits like this:

    work = dist.irecv(buffer, ...)
    waiting.wait(work)        # returns when the message is there; raises StoppedWaiting when asked

The blocking `work.wait()` runs in a helper thread while this thread checks, every 50 ms, whether it
was asked to stop (`stop_when` installs the question; the worker asks about a file in the run folder).
Outside a check nothing is installed, and `wait` is a plain `work.wait()`. A wait that was stopped
leaves its helper thread blocked until the group's own timeout; the next wait gets a new helper, and
the worker replaces the process group of a case that failed.
"""
from __future__ import annotations

import contextlib
import queue
import threading
import time


class StoppedWaiting(RuntimeError):
    """Raised in a rank that was asked to stop waiting (the check found every rank of its case waiting)."""


class WaitTimedOut(RuntimeError):
    """Raised by `until` when what it waits for has not happened within its time (as a group's timeout)."""


_stop_checks: list = []          # callables returning a reason (str) to stop, or None
_helpers = threading.local()     # each thread's helper (a rank's lanes wait at once: pipeline/trace.py Tracer.lane)


@contextlib.contextmanager
def stop_when(should_stop):
    """Within the block, `wait` raises StoppedWaiting(reason) as soon as `should_stop()` gives a reason."""
    _stop_checks.append(should_stop)
    try:
        yield
    finally:
        _stop_checks.pop()


@contextlib.contextmanager
def also_stop_when(should_stop):
    """As `stop_when`, keeping the check already installed (the check's own request to stop): `wait` asks the
    innermost check only."""
    outer = _stop_checks[-1] if _stop_checks else None
    with stop_when(lambda: should_stop() or (outer() if outer is not None else None)):
        yield


class _Helper:
    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._serve, daemon=True, name="lab-wait").start()

    def _serve(self) -> None:
        while True:
            work, done, failure = self.jobs.get()
            try:
                work.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                failure.append(e)
            done.set()
            # let go of the work at once: it holds the message's tensors, which the rank's memory scan
            # (harness/live.py) would otherwise find alive until the next wait
            del work, done, failure


def stoppable() -> bool:
    """Whether a wait here can be stopped (inside a check's case)."""
    return bool(_stop_checks)


def barrier(group) -> None:
    """A barrier of `group` that the check can stop; the lab's own, never recorded as an answer's (the
    original of a recorder's wrapper: comm/collectives.py records the barriers answers call)."""
    import torch.distributed as dist
    original = getattr(dist.barrier, "__wrapped__", dist.barrier)
    wait(original(group=group, async_op=True))


def wait(work, poll_s: float = 0.05) -> None:
    """`work.wait()`, unless the rank is asked to stop first (then StoppedWaiting)."""
    if not _stop_checks or threading.current_thread().name == "lab-wait":
        work.wait()                         # (on the helper itself: a wrapped work waiting for its own work)
        return
    helper = getattr(_helpers, "helper", None)
    if helper is None:
        helper = _helpers.helper = _Helper()
    done, failure = threading.Event(), []
    helper.jobs.put((work, done, failure))
    while not done.wait(poll_s):
        reason = _stop_checks[-1]()
        if reason:
            _helpers.helper = None          # it stays blocked in this wait; later waits get a new one
            raise StoppedWaiting(reason)
    if failure:
        raise failure[0]


def until(ready, timeout_s: float, what: str, clock=None) -> None:
    """Return once `ready()` is true, polling it (every 0.2 ms at first, then up to every 10 ms); raise
    StoppedWaiting when the rank is asked to stop, WaitTimedOut after `timeout_s` (`what`: the wait, in
    words, for its message). The request to stop is looked at once more after `ready()`: what makes a
    wait ready may be another rank's answer to the same request (harness/case_barrier.py: a stopped rank
    leaves the case), and the rank must then say it was stopped whichever it saw first. `clock`: made when the
    wait begins, what the timeout is read on once the wall clock is past it (twice a second: reading it may
    cost), as harness/own_time.py `peers_clock` (a barrier does not time out on ranks that were starved of CPU)."""
    deadline, pause = time.monotonic() + timeout_s, 0.0002
    own, read_at = (clock() if clock is not None else None), 0.0
    while True:
        done = ready()
        reason = _stop_checks[-1]() if _stop_checks else None
        if reason:
            raise StoppedWaiting(reason)
        if done:
            return
        now = time.monotonic()
        if now > deadline and (own is None or now - read_at >= 0.5):
            read_at = now
            if own is None or own.elapsed_s() > timeout_s:
                raise WaitTimedOut(f"{what}: timed out after {timeout_s:g} s")
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
