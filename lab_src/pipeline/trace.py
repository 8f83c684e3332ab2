"""The event record behind every picture of a run.

Each rank records one `Event` per forward or backward chunk, per point-to-point operation and per
collective (q14's all-reduces):

    (rank, kind, microbatch, peer, shape, bytes, t_start, t_end, chunk, held[, group[, lane[, state]]])

`rank` and `peer` are pipeline ranks; `kind` is an operation of `schedules.Op` ("forward", "send_forward",
...) or a collective of COLLECTIVES, which the topics declare (q14's "allreduce_dp", q17's "all_reduce", ...:
lab_src/topics/<topic>/__init__.py); `chunk` is the model chunk of the
rank (0 unless the schedule is interleaved); `held` is the activation memory the rank holds when the
operation ends: bytes of tensors saved for backward and not yet freed (harness/memory.py counts them while a
pipeline case runs its step; 0 where nothing was counted); `group`, for a collective only, the global ranks
taking part (a collective has no peer, and its `bytes` is the buffer this rank handed to it); `lane`, the
thread of the rank that did it where it is not the main one (Tracer.lane); `state`, where the case measured it
(the sharding kinds), the bytes of the training state the rank held when the operation ended, one figure per
STATE_KINDS (parameters, gathered copies, gradients, optimizer state). Rows of 8 or 9 fields (written
before `chunk` or `held` existed) still load. Times are seconds on the host's monotonic clock
(`time.perf_counter`), which every process of a `torchrun --standalone` run shares, so the ranks'
timelines line up without any synchronisation; `CaseOutcome.events()` moves a case's first event to 0.

Besides keeping events in memory, a tracer journals each operation when it begins and when it ends
(the worker gives it a writer in the format of harness/runfolder.py). A rank that hangs, or is killed, leaves its journal behind: the deadlock
report reads from it what each rank last finished and what it is still waiting in.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import astuple, dataclass, replace
from pathlib import Path

from lab_src import topics
from lab_src.pipeline.ops import Op

COMPUTE = tuple(o.value for o in Op if o.is_compute)
SENDS = tuple(o.value for o in Op if o.is_send)
RECVS = tuple(o.value for o in Op if o.is_recv)
# Collectives, as the topics declare them (q14's data-parallel average and tied-embedding sum, the raw
# collectives of a tensor-parallel answer, ...)
COLLECTIVES = tuple(e.name for e in topics.event_kinds() if e.collective)
KINDS = tuple(o.value for o in Op) + COLLECTIVES
# A case's barrier (harness/case_barrier.py), journalled for the deadlock watch only: not an event of the
# run, and not the operation a rank's error names
BARRIER = "barrier"
# A wait of the rank's main thread for what one of its lanes does (q20: the buckets its reducing thread still
# reduces), journalled for the deadlock watch: stuck when that lane is stuck or has nothing to do. Its `peer` is
# the lane's number.
LANE_WAIT = "wait_lane"
# A lane with nothing to do: its thread waits for work from the rank's main thread (q20: an empty queue of buckets),
# journalled so that the deadlock watch tells it from a lane busy between two operations (which may go on).
LANE_IDLE = "lane_idle"
# What an event's `state` counts, in order: the parameters the rank keeps (whole, or its shards), the whole weights
# it has gathered and not yet freed (q22's FSDP), the gradients (.grad), the optimizer's state (q21's `state` dict,
# AdamW's moments). Activations are `held`.
STATE_KINDS = ("parameters", "gathered", "gradients", "optimizer")


@dataclass(frozen=True)
class Event:
    rank: int
    kind: str
    microbatch: int | None
    peer: int | None
    shape: tuple | None
    bytes: int
    t_start: float
    t_end: float
    chunk: int = 0
    held: int = 0                   # bytes saved for backward held by the rank when the operation ended
    group: tuple | None = None      # a collective's global ranks
    lane: int = 0                   # the rank's thread that did it: 0 the main one (Tracer.lane)
    state: tuple | None = None      # bytes of the training state held when it ended, per STATE_KINDS

    @property
    def duration(self) -> float:
        return self.t_end - self.t_start

    @property
    def op(self) -> Op | None:
        return Op.of(self.kind)

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    @property
    def is_send(self) -> bool:
        return self.kind in SENDS

    @property
    def is_recv(self) -> bool:
        return self.kind in RECVS

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVES

    @property
    def phase(self) -> str:
        """"forward" (activations) or "backward" (gradients); "collective" for a collective."""
        return "collective" if self.is_collective else Op(self.kind).phase

    def label(self) -> str:
        """Short text such as 'F3', 'B0', 'send_forward(mb=2) to rank 1'."""
        if self.is_compute:
            return f"{self.op.letter}{self.microbatch}"
        if self.is_collective:
            return f"{self.kind} over ranks {list(self.group or ())}"
        direction = "to" if self.is_send else "from"
        return f"{self.kind}(mb={self.microbatch}) {direction} rank {self.peer}"

    def to_row(self) -> tuple:
        row = astuple(self)
        if self.state is not None:
            return row
        row = row[:-1]
        if self.lane:
            return row
        return row[:-1] if self.group is not None else row[:-2]   # a P2P or compute row is as it always was

    @classmethod
    def from_row(cls, row) -> "Event":
        rank, kind, mb, peer, shape, nbytes, t0, t1, *rest = row
        chunk = rest[0] if rest else 0
        held = rest[1] if len(rest) > 1 else 0
        group = tuple(rest[2]) if len(rest) > 2 and rest[2] is not None else None
        lane = rest[3] if len(rest) > 3 else 0
        state = tuple(rest[4]) if len(rest) > 4 and rest[4] is not None else None
        return cls(rank, kind, mb, peer, tuple(shape) if shape is not None else None, nbytes, t0, t1, chunk, held,
                   group, lane, state)


class Tracer:
    """Records the events of one rank, and journals each operation as it begins and ends.

    A rank may work in more than one thread (a lane): the main one, lane 0, and for example one that reduces
    gradients while the main one computes (q20, lab_src/topics/data_parallel/README.md). The operation in progress is each
    thread's own (`pending`, `pending_since`); a thread says which lane it is with `with tracer.lane(1):`, and
    what it journals and records carries that lane."""

    def __init__(self, rank: int, journal=None, sync=None, label: str = ""):
        self.rank = rank
        self.events: list[Event] = []
        self.sync = sync                      # e.g. torch.cuda.synchronize, so GPU times are real
        self.label = label                    # which case of a launch this is
        self._thread = threading.local()      # per thread: pending, pending_since, lane
        self._journal = journal               # journal(tag, pending): harness/runfolder.py's format, or None
        self.memory = None                    # () -> bytes saved for backward now held (harness/memory.py)
        self.state_memory = None              # () -> the training state's bytes now held, per STATE_KINDS

    @property
    def pending(self) -> "Pending | None":
        """The operation this thread is in."""
        return getattr(self._thread, "pending", None)

    @pending.setter
    def pending(self, value: "Pending | None") -> None:
        self._thread.pending = value

    @property
    def pending_since(self) -> float | None:
        """When this thread's operation began (time.perf_counter)."""
        return getattr(self._thread, "since", None)

    @pending_since.setter
    def pending_since(self, value: float | None) -> None:
        self._thread.since = value

    @property
    def current_lane(self) -> int:
        return getattr(self._thread, "lane", 0)

    @contextlib.contextmanager
    def lane(self, number: int):
        """This thread works in lane `number` of the rank within the block."""
        before = self.current_lane
        self._thread.lane = number
        try:
            yield self
        finally:
            self._thread.lane = before

    def _pending(self, kind: str, microbatch, peer, chunk: int = 0) -> "Pending":
        return Pending(self.label, kind, microbatch, peer, chunk, self.current_lane)

    @contextlib.contextmanager
    def span(self, kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0, chunk: int = 0,
             group: tuple | None = None):
        # what a deadlock report names: the peer of a message, the ranks of a collective
        pending = self.pending = self._pending(kind, microbatch, peer if group is None else list(group), chunk)
        self._write("B", pending)
        t_start = self.pending_since = time.perf_counter()
        yield
        if self.sync is not None:
            self.sync()
        t_end = time.perf_counter()
        self.pending = self.pending_since = None
        self.record(Event(self.rank, kind, microbatch, peer, tuple(shape) if shape is not None else None, nbytes,
                          t_start, t_end, chunk, group=tuple(group) if group is not None else None), pending)

    def held(self) -> int:
        return self.memory() if self.memory is not None else 0

    def begin(self, kind: str, microbatch=None, peer=None, posted: bool = False, chunk: int = 0) -> Pending:
        """Journal the start of an operation that ends later; `record` ends it. `posted`: a message posted
        (a raw isend or irecv, or a stage's post_recv) that the rank does not wait for yet: `awaits` says when
        it does."""
        pending = self._pending(kind, microbatch, peer, chunk)
        self._write("P" if posted else "B", pending)
        return pending

    def awaits(self, pending: Pending) -> None:
        """Journal that the rank now waits for the posted message `pending` (harness/deadlock.py)."""
        self.pending, self.pending_since = pending, time.perf_counter()
        self._write("A", pending)

    def record(self, event: Event, pending: Pending | None = None) -> None:
        """Keep a finished event (with the memory held now, and this thread's lane) and journal its end."""
        if self.current_lane and not event.lane:
            event = replace(event, lane=self.current_lane)
        if self.memory is not None:
            event = replace(event, held=self.held())
        if self.state_memory is not None:
            event = replace(event, state=tuple(int(b) for b in self.state_memory()))
        self.events.append(event)
        if pending is not None:
            self._write("E", pending)

    def _write(self, tag: str, pending: Pending) -> None:
        if self._journal:
            self._journal(tag, pending.to_list())

    def mark(self, kind: str, number: int) -> None:
        """Journal that something of the lab happened now (q20's `dp.launch`: "launch", its number in the step), a
        line the launching process reads in order with the operations' (harness/case_watch.py `order`)."""
        self._write("M", self._pending(kind, number, None))

    def finished(self) -> None:
        """Journal that this rank has done its part of the case: from now on it only waits for its sends
        to be delivered and for the other ranks (the deadlock watch counts it as sending nothing more)."""
        if self._journal:
            self._journal("W", [self.label])


@dataclass
class Pending:
    """An operation a rank is in (a receive it waits in, a message it posted), as the journal, the deadlock
    watch and a rank's error name it. Its plain form, which they carry (`to_list`, `from_list`), is
    [label, kind, micro-batch, peer], with the model chunk after them where it is not 0 (interleaved), and the
    lane after the chunk where it is not 0 (a thread of the rank other than its main one: Tracer.lane)."""
    label: str                      # the case it belongs to (its index in the launch)
    kind: str                       # an operation of `schedules.Op`, or a collective
    microbatch: int | None
    peer: int | list | None         # a collective's: the ranks taking part
    chunk: int = 0
    lane: int = 0

    def to_list(self) -> list:
        tail = [self.chunk, self.lane] if self.lane else [self.chunk] if self.chunk else []
        return [self.label, self.kind, self.microbatch, self.peer] + tail

    @classmethod
    def from_list(cls, row) -> "Pending":
        label, kind, mb, peer = row[:4]
        return cls(label, kind, mb, peer, row[4] if len(row) > 4 else 0, row[5] if len(row) > 5 else 0)

    @property
    def what(self) -> list:
        """The plain form without the case: what two journal lines of the same operation share."""
        return self.to_list()[1:]


def unpack(pending: list) -> tuple:
    """(kind, micro-batch, peer, chunk) of a pending operation in its plain form (a rank's error)."""
    p = Pending.from_list(pending)
    return p.kind, p.microbatch, p.peer, p.chunk


def op_text(kind: str, microbatch, chunk: int = 0, chunked: bool = False) -> str:
    """'recv_forward(mb=3)', or 'recv_forward(mb=3, chunk 1)' for a chunk other than 0 or, with `chunked`
    (a rank of an interleaved pipeline), for every chunk. A message of no micro-batch (q19's ring) is 'a send'
    or 'a receive': it is no pipeline's operation."""
    if microbatch is None and kind in SENDS + RECVS:
        return "a send" if kind in SENDS else "a receive"
    return f"{kind}(mb={microbatch}{f', chunk {chunk}' if chunk or chunked else ''})"


_active: list[Tracer] = []


def active() -> Tracer | None:
    return _active[-1] if _active else None


@contextlib.contextmanager
def tracing(tracer: Tracer):
    _active.append(tracer)
    try:
        yield tracer
    finally:
        _active.pop()


@contextlib.contextmanager
def span(kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0, chunk: int = 0,
         group: tuple | None = None):
    """Record under the active tracer, if any (code run outside a check is simply not traced)."""
    t = active()
    if t is None:
        yield
    else:
        with t.span(kind, microbatch, peer, shape, nbytes, chunk, group):
            yield


class Posted:
    """A message posted now and waited for later (`PipelineStage.post_recv`), under the active tracer if
    any: journalled P when posted (the deadlock watch counts the receive as taking the peer's next
    message from then on), A when the rank begins to wait for it, E when the wait returns. Its event
    spans the wait, as a plain receive's does: the time the rank was held up by the message."""

    def __init__(self, kind: str, microbatch, peer, shape, nbytes: int, chunk: int = 0):
        self.tracer = active()
        self.what = (kind, microbatch, peer, tuple(shape) if shape is not None else None, nbytes)
        self.chunk = chunk
        self.pending = self.tracer.begin(kind, microbatch, peer, posted=True, chunk=chunk) if self.tracer else None

    @contextlib.contextmanager
    def posting(self):
        """Around the call that posts it: the rank is in this operation (so comm/messages.py, which records
        raw torch.distributed calls made outside any operation, leaves it to this record)."""
        t = self.tracer
        if t is None:
            yield
            return
        before, t.pending = t.pending, self.pending
        yield
        t.pending = before

    @contextlib.contextmanager
    def waited(self):
        t = self.tracer
        if t is None:
            yield
            return
        t.awaits(self.pending)
        t_start = t.pending_since
        yield                               # on an exception `pending` stays set, as in Tracer.span
        if t.sync is not None:
            t.sync()
        t_end = time.perf_counter()
        t.pending = t.pending_since = None
        t.record(Event(t.rank, *self.what, t_start, t_end, self.chunk), self.pending)


@contextlib.contextmanager
def delivering(kind: str, microbatch, peer, chunk: int = 0):
    """Around the wait for a send already recorded (a stage's, posted as it was sent) to be delivered, at the
    end of a step: journalled A when the wait begins and E when it returns (none on an exception), for the
    deadlock watch alone (harness/deadlock.py). No event, and the rank's operation in progress stays what it
    was: the send ended when it was posted, and the rank has done its part."""
    t = active()
    if t is None:
        yield
        return
    pending = t._pending(kind, microbatch, peer, chunk)
    t._write("A", pending)
    yield
    t._write("E", pending)


@contextlib.contextmanager
def waiting_for_lane(lane: int):
    """Around a wait of this thread for what lane `lane` of the rank does (a queue's join, a future's result):
    the operation in progress, journalled B and E for the deadlock watch; no event (the lane's own are)."""
    t = active()
    if t is None:
        yield
        return
    pending = t._pending(LANE_WAIT, None, lane)
    before, since = t.pending, t.pending_since
    t.pending, t.pending_since = pending, time.perf_counter()
    t._write("B", pending)
    yield                                   # on an exception `pending` stays set, as in Tracer.span
    t.pending, t.pending_since = before, since
    t._write("E", pending)


@contextlib.contextmanager
def idle_lane():
    """Around a lane's wait for work from its rank's main thread (a queue's get): journalled B and E for the
    deadlock watch, which counts the lane as idle only within it; no event."""
    t = active()
    if t is None:
        yield
        return
    pending = t._pending(LANE_IDLE, None, None)
    t.pending, t.pending_since = pending, time.perf_counter()
    t._write("B", pending)
    try:
        yield
    finally:
        t.pending = t.pending_since = None
        t._write("E", pending)


def waiting(kind: str, group: tuple):
    """Mark a collective's preparation as the operation in progress (for the journal and an error's report)
    without recording an event: its members agreeing on what to reduce is not the reduction (q14)."""
    return _journalled(kind, group, in_progress=True)


def at_barrier(ranks: list[int]):
    """Journal that the rank waits at its case's barrier with `ranks`, for the deadlock watch alone: the
    rank's operation in progress stays what it was, and nothing is recorded."""
    return _journalled(BARRIER, ranks, in_progress=False)


@contextlib.contextmanager
def _journalled(kind: str, group, in_progress: bool):
    """B when the block begins, E when it ends (on an exception, no E: the journal says where the rank
    stayed); `in_progress`: also the tracer's operation in progress while it runs (left set on an
    exception, as in Tracer.span)."""
    t = active()
    if t is None:
        yield
        return
    pending = t._pending(kind, None, list(group))
    if in_progress:
        t.pending = pending
    t._write("B", pending)
    yield
    if in_progress:
        t.pending = None
    t._write("E", pending)


def save_events(events: list[Event], path: Path) -> None:
    Path(path).write_text(json.dumps([e.to_row() for e in events]))


def load_events(path: Path) -> list[Event]:
    return [Event.from_row(r) for r in json.loads(Path(path).read_text())]
