"""The event record behind every picture of a run.

Each rank records one `Event` per forward or backward chunk and per point-to-point operation:

    (rank, kind, microbatch, peer, shape, bytes, t_start, t_end, chunk)

`rank` and `peer` are pipeline ranks; `kind` is an operation of `schedules.Op` ("forward", "send_forward",
...); `chunk` is the model chunk of the rank (0 unless the schedule is interleaved). Times are seconds on the host's monotonic clock
(`time.perf_counter`), which every process of a `torchrun --standalone` run shares, so the ranks'
timelines line up without any synchronisation; `CaseOutcome.events()` moves a case's first event to 0.

Besides keeping events in memory, a tracer journals each operation when it begins and when it ends
(the worker gives it a writer in the format of harness/runfolder.py). A rank that hangs, or is killed, leaves its journal behind: the deadlock
report reads from it what each rank last finished and what it is still waiting in.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import astuple, dataclass
from pathlib import Path

from lab_src.pipeline.schedules import Op

COMPUTE = tuple(o.value for o in Op if o.is_compute)
SENDS = tuple(o.value for o in Op if o.is_send)
RECVS = tuple(o.value for o in Op if o.is_recv)
KINDS = tuple(o.value for o in Op)


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
    def phase(self) -> str:
        """"forward" (activations) or "backward" (gradients)."""
        return Op(self.kind).phase

    def label(self) -> str:
        """Short text such as 'F3', 'B0', 'send_forward(mb=2) to rank 1'."""
        if self.is_compute:
            return f"{self.kind[0].upper()}{self.microbatch}"
        direction = "to" if self.is_send else "from"
        return f"{self.kind}(mb={self.microbatch}) {direction} rank {self.peer}"

    def to_row(self) -> tuple:
        return astuple(self)

    @classmethod
    def from_row(cls, row) -> "Event":
        rank, kind, mb, peer, shape, nbytes, t0, t1, *chunk = row
        return cls(rank, kind, mb, peer, tuple(shape) if shape is not None else None, nbytes, t0, t1, *chunk[:1])


class Tracer:
    """Records the events of one rank, and journals each operation as it begins and ends."""

    def __init__(self, rank: int, journal=None, sync=None, label: str = ""):
        self.rank = rank
        self.events: list[Event] = []
        self.sync = sync                      # e.g. torch.cuda.synchronize, so GPU times are real
        self.label = label                    # which case of a launch this is
        self.pending: list | None = None      # the operation in progress: [label, kind, mb, peer]
        self.pending_since: float | None = None   # when it began (time.perf_counter)
        self._journal = journal               # journal(tag, pending): harness/runfolder.py's format, or None

    @contextlib.contextmanager
    def span(self, kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0, chunk: int = 0):
        pending = self.pending = [self.label, kind, microbatch, peer]
        if self._journal:
            self._journal("B", pending)
        t_start = self.pending_since = time.perf_counter()
        yield
        if self.sync is not None:
            self.sync()
        t_end = time.perf_counter()
        self.pending = self.pending_since = None
        self.events.append(Event(self.rank, kind, microbatch, peer,
                                 tuple(shape) if shape is not None else None, nbytes, t_start, t_end, chunk))
        if self._journal:
            self._journal("E", pending)


    def finished(self) -> None:
        """Journal that this rank has done its part of the case: from now on it only waits for its sends
        to be delivered and for the other ranks (the deadlock watch counts it as sending nothing more)."""
        if self._journal:
            self._journal("W", [self.label])


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
def span(kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0, chunk: int = 0):
    """Record under the active tracer, if any (code run outside a check is simply not traced)."""
    t = active()
    if t is None:
        yield
    else:
        with t.span(kind, microbatch, peer, shape, nbytes, chunk):
            yield


def save_events(events: list[Event], path: Path) -> None:
    Path(path).write_text(json.dumps([e.to_row() for e in events]))


def load_events(path: Path) -> list[Event]:
    return [Event.from_row(r) for r in json.loads(Path(path).read_text())]
