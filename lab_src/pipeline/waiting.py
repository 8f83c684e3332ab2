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

How long a wait may last (`time_out_after`, installed by the worker for each case): gloo gives up a
receive after the group's timeout on the wall clock, and on a loaded machine a receive whose message is on
its way, behind peers starved of CPU, ran past it (a 4-stage all-forward-all-backward step, graded beside
the test suite: rank 0 waited 21 s for its first gradient while ranks 1 to 3 computed the backward chain;
its receive timed out, and a valid answer lost the case). Inside a case, a wait for one of torch's works
gives gloo a backstop times the timeout on the wall clock (`Work.wait(timeout)`: a receive's or a send's
own; a collective's wait still ends at the group's), and gives up itself after the timeout read on the
case's clock: the wall clock less the longest time one of the case's ranks waited for a CPU since the case
began (harness/own_time.py `peers_clock`), as the case's barriers and deadline are read. Lenient by what
the ranks waited for a CPU before the wait began; never past the backstop's timeouts of wall time.
"""
from __future__ import annotations

import contextlib
import datetime
import queue
import threading
import time


class StoppedWaiting(RuntimeError):
    """Raised in a rank that was asked to stop waiting (the check found every rank of its case waiting)."""


class WaitTimedOut(RuntimeError):
    """Raised by `until` when what it waits for has not happened within its time (as a group's timeout)."""


_stop_checks: list = []          # callables returning a reason (str) to stop, or None
_limits: list = []               # (timeout_s, clock, backstop): how long a wait may last, installed for a case
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
def time_out_after(timeout_s: float, clock, backstop: float):
    """Within the block, `wait` raises WaitTimedOut once it has lasted `timeout_s` of wall time less
    `clock.waited_s()` (made when the block begins: the longest time one of the case's ranks has waited for a
    CPU since, harness/own_time.py `peers_clock`), and gloo waits `backstop` times as long on the wall clock for a
    message (harness/limits.py BUSY_BACKSTOP)."""
    _limits.append((timeout_s, clock, backstop))
    try:
        yield
    finally:
        _limits.pop()


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
            work, done, failure, backstop_s = self.jobs.get()
            try:
                if backstop_s is not None:
                    work.wait(datetime.timedelta(seconds=backstop_s))
                else:
                    work.wait()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                failure.append(e)
            # let go of the work before the waiting thread goes on: it holds the message's tensors, which the
            # rank's memory scan (harness/live.py) right after the wait would otherwise find alive, or not,
            # as the two threads happened to run (q23's sequence-parallel block scans after its last collective)
            work = None
            done.set()
            del done, failure


def _is_torch_work(work) -> bool:
    """torch's own Work (whose wait takes a timeout), not a wrapper of the lab's or an answer's."""
    import torch.distributed as dist
    return isinstance(work, dist.Work)


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
    # torch's own works only: gloo's wall-clock timeout is what the case's clock replaces (a lane's job, or a
    # wrapper of the lab's, keeps the waits it had)
    timeout_s, clock, backstop = _limits[-1] if _limits and _is_torch_work(work) else (None, None, None)
    helper.jobs.put((work, done, failure, None if timeout_s is None else backstop * timeout_s))
    began = read_at = time.monotonic()
    while not done.wait(poll_s):
        reason = _stop_checks[-1]()
        if reason:
            _helpers.helper = None          # it stays blocked in this wait; later waits get a new one
            raise StoppedWaiting(reason)
        now = time.monotonic()
        if timeout_s is not None and now - began > timeout_s and now - read_at >= 0.5:
            read_at = now                   # the clock read twice a second at most, past the wall clock's time
            if now - began - clock.waited_s() > timeout_s:
                _helpers.helper = None
                raise WaitTimedOut(f"timed out after {timeout_s:g} s, the time the other ranks waited for a "
                                   f"CPU not counted ({now - began:.0f} s of wall time)")
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
