"""Work a rank does beside its main line: the student's q19 ring in lane 1 (pipeline/trace.py `Tracer.lane`).

Two ways a topic runs the ring there, both recorded in lane 1, the thin row the timeline draws under the rank's own,
and followed on their own by the deadlock watch:

    worker = Worker(tracer)               a thread of its own (q20's reducing thread): jobs run one after another,
    job = worker.submit(Job(fn))          in the order submitted, while the main thread goes on; `job.wait()` is
    job.wait()                            journalled as a wait for the lane and can be stopped by the check
    worker.close()

    with inline(tracer):                  the main thread itself, inside an operation of its own (q22's gathers run
        ring(tensor, group)               inside a forward or a backward): that operation is set aside while the
                                          ring's messages are the lane's, and restored after

`ring_all_reduce(tensor, group, qid)` is the answer's q19 ring (in grading, the reference's), called for exercise
`qid` so that an error in it names q19's answer and the exercise that used it.
"""
from __future__ import annotations

import contextlib
import queue
import threading

from lab_src.pipeline import trace, waiting

LANE = 1


def ring_all_reduce(tensor, group, qid: str) -> None:
    """The student's q19 ring over `group`, run for exercise `qid`."""
    from lab_src import exercises
    with exercises.running_for(qid):
        exercises.ring_all_reduce(tensor, group)


@contextlib.contextmanager
def inline(tracer, number: int = LANE):
    """This thread's operations go to lane `number` within the block; the operation it is in (a forward, a backward)
    is set aside meanwhile and restored after, not on an exception (the error then names the lane's message).
    For the deadlock watch (harness/deadlock.py), the main line waits for its lane within the block (LANE_WAIT), and
    the lane has nothing to do outside it (LANE_IDLE, journalled as the block ends): a rank whose ring waits for a
    message nobody will send is stuck, and one whose ring is done does not keep a stuck case going."""
    if tracer is None:
        yield
        return
    before, since = tracer.pending, tracer.pending_since
    wait = tracer._pending(trace.LANE_WAIT, None, number)
    tracer._write("B", wait)
    tracer.pending = tracer.pending_since = None
    with tracer.lane(number):
        idle = tracer._pending(trace.LANE_IDLE, None, None)
        tracer._write("E", idle)
        yield
        tracer._write("B", idle)
    tracer._write("E", wait)
    tracer.pending, tracer.pending_since = before, since


class _Done:
    """What `waiting.wait` waits on: a job's event (a work-like object)."""

    def __init__(self, event: threading.Event):
        self.event = event

    def wait(self):
        self.event.wait()
        return True


class Job:
    """One piece of work for a lane's thread: `run()` there; `wait()` here, until it has run (raises what it raised)."""

    def __init__(self, fn=None):
        self.fn = fn
        self.error: BaseException | None = None
        self._done = threading.Event()

    def run(self) -> None:
        self.fn()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def wait(self):
        if not self._done.is_set():
            with trace.waiting_for_lane(LANE):
                waiting.wait(_Done(self._done))
        if self.error is not None:
            raise self.error


class Worker:
    """A thread of the rank working in lane 1: jobs one after another, in the order submitted."""

    def __init__(self, name: str = "lab-lane"):
        self.name = name
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None

    def submit(self, job: Job) -> Job:
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, args=(trace.active(),), name=self.name, daemon=True)
            self._thread.start()
        self._queue.put(job)
        return job

    def _work(self, tracer) -> None:
        with (tracer.lane(LANE) if tracer is not None else contextlib.nullcontext()):
            while True:
                with trace.idle_lane():         # the deadlock watch: idle here, and only here
                    job = self._queue.get()
                if job is None:
                    return
                try:
                    job.run()
                except BaseException as e:  # noqa: BLE001 - handed to the waiting thread, which raises it
                    job.error = e
                finally:
                    job._done.set()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)
            self._thread = None
