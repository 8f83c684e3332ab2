"""The event record behind every picture of a run.

Each rank records one `Event` per forward or backward chunk and per point-to-point operation:

    (rank, kind, microbatch, peer, shape, bytes, t_start, t_end)

`rank` and `peer` are pipeline ranks. Times are seconds on the host's monotonic clock
(`time.perf_counter`), which every process of a `torchrun --standalone` run shares, so the ranks'
timelines line up without any synchronisation; `CaseOutcome.events()` moves a case's first event to 0.

Besides keeping events in memory, a tracer appends one line to a journal file when an operation
begins and one when it ends. A rank that hangs, or is killed, leaves its journal behind: the deadlock
report reads from it what each rank last finished and what it is still waiting in.
"""
from __future__ import annotations

import contextlib
import json
import time
from dataclasses import astuple, dataclass
from pathlib import Path

COMPUTE = ("forward", "backward")
SENDS = ("send_forward", "send_backward")
RECVS = ("recv_forward", "recv_backward")
KINDS = COMPUTE + SENDS + RECVS


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

    @property
    def duration(self) -> float:
        return self.t_end - self.t_start

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    def label(self) -> str:
        """Short text such as 'F3', 'B0', 'send_forward(mb=2) to rank 1'."""
        if self.is_compute:
            return f"{self.kind[0].upper()}{self.microbatch}"
        direction = "to" if self.kind in SENDS else "from"
        return f"{self.kind}(mb={self.microbatch}) {direction} rank {self.peer}"

    def to_row(self) -> tuple:
        return astuple(self)

    @classmethod
    def from_row(cls, row) -> "Event":
        rank, kind, mb, peer, shape, nbytes, t0, t1 = row
        return cls(rank, kind, mb, peer, tuple(shape) if shape is not None else None, nbytes, t0, t1)


class Tracer:
    """Records the events of one rank, and journals each operation as it begins and ends."""

    def __init__(self, rank: int, journal=None, sync=None, label: str = ""):
        self.rank = rank
        self.events: list[Event] = []
        self.sync = sync                      # e.g. torch.cuda.synchronize, so GPU times are real
        self.label = label                    # which case of a launch this is
        self.pending: list | None = None      # the operation in progress: [label, kind, mb, peer]
        self._journal = journal               # a line-buffered text file, or None

    def note(self, text: str) -> None:
        if self._journal:
            self._journal.write(f"{time.perf_counter():.6f} {text}\n")

    @contextlib.contextmanager
    def span(self, kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0):
        self.pending = [self.label, kind, microbatch, peer]
        what = json.dumps(self.pending) if self._journal else ""
        self.note(f"B {what}")
        t_start = time.perf_counter()
        yield
        if self.sync is not None:
            self.sync()
        t_end = time.perf_counter()
        self.pending = None
        self.events.append(Event(self.rank, kind, microbatch, peer,
                                 tuple(shape) if shape is not None else None, nbytes, t_start, t_end))
        self.note(f"E {what}")


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
def span(kind: str, microbatch=None, peer=None, shape=None, nbytes: int = 0):
    """Record under the active tracer, if any (code run outside a check is simply not traced)."""
    t = active()
    if t is None:
        yield
    else:
        with t.span(kind, microbatch, peer, shape, nbytes):
            yield


def save_events(events: list[Event], path: Path) -> None:
    Path(path).write_text(json.dumps([e.to_row() for e in events]))


def load_events(path: Path) -> list[Event]:
    return [Event.from_row(r) for r in json.loads(Path(path).read_text())]


def read_journal(path: Path) -> list[tuple[float, str, list]]:
    """(time, 'B'|'E'|other, payload) for each journal line; torn last lines are skipped."""
    out = []
    if not Path(path).exists():
        return out
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) < 2:
            continue
        try:
            t = float(parts[0])
        except ValueError:
            continue
        tag = parts[1]
        payload = parts[2] if len(parts) > 2 else ""
        if tag in ("B", "E"):
            try:
                payload = json.loads(payload)
            except json.JSONDecodeError:
                continue
        out.append((t, tag, payload))
    return out
