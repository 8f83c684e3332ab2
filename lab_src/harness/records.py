"""What a rank reports besides its observations, typed: its error, and its memory. Torch-free: the rank
writes these, the launching process and the judges read them.

Both travel inside a rank's observations (`torch.save` of plain values, harness/worker.py), so each
converts to and from its plain form (`to_dict`, `from_dict`) at that boundary, and the plain form is
what the files hold and what the judges index.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lab_src.pipeline.trace import Pending

# Not an exit status (those are 0 to 255, or minus a signal's number): the status harness/elastic.py gives a rank
# whose process ended with status 0 before its worker returned (os._exit(0) in an answer, say), which torch's
# agent would otherwise wait for, for ever, as a rank still at work
ENDED_WITHOUT_RETURNING = 256


def exit_text(code: int) -> str:
    """How a rank's process ended, from its exit status."""
    if code == ENDED_WITHOUT_RETURNING:
        return "its process ended with status 0 before its work was done (os._exit, or a process killed)"
    return f"exit code {code}"


def gave_up_waiting(message: str, kind: str = "") -> str | None:
    """"stopped" when the check stopped a rank waiting in a deadlock (pipeline/waiting.py), "timeout"
    when a receive (or send) timed out, "peer" when the peer's connection closed under it (the peer
    timed out or died first), None for any other error. `kind`: the exception's type name."""
    if kind == "StoppedWaiting":
        return "stopped"
    if kind == "WaitTimedOut":      # a case's barrier (harness/case_barrier.py)
        return "timeout"
    text = message.lower()
    if "timed out" in text or "timeout" in text:
        return "timeout"
    if "closed by peer" in text or "connection reset" in text:
        return "peer"
    return None


# the attribute comm/messages.py sets on an exception that left a call of q11's function: that call, in words
Q11_CALL = "lab_q11_call"


@dataclass
class RankError:
    """Why a rank's part of a case ended early: an exception it raised (harness/worker.py), a case it did
    not run, an observation file that could not be read (harness/runner.py), or, for a rank that left no
    observations, what its journal says it was waiting in (harness/deadlock.py, `recover`)."""
    type: str                           # the exception's type name, or NotRun, Stopped, ...
    message: str
    where: list = field(default_factory=list)   # [file, line, function, text] of the frames a student reads
    pending: Pending | None = None      # the operation it was in
    pending_since: float | None = None  # when it began (time.perf_counter)
    at: float | None = None             # when the rank gave up
    traceback: str | None = None        # the whole traceback, torch's frames included
    call: str | None = None             # the q11 call it was in: "send_forward_recv_backward(mb=1, recv_mb=0)"

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pending"] = self.pending.to_list() if self.pending is not None else None
        return {k: v for k, v in d.items() if v is not None or k == "pending"}

    @classmethod
    def from_dict(cls, d: dict) -> "RankError":
        return cls(**{**d, "pending": Pending.from_list(d["pending"]) if d.get("pending") else None})


@dataclass
class Memory:
    """`obs["memory"]`: the peaks a rank measured while its step ran. A pipeline case counts the
    activations saved for backward (harness/memory.py) beside the process's resident set; an interleaved
    case, what its `InterleavedStage` held across chunks. A field a case does not measure stays None and
    is left out of the plain form."""
    peak_saved_bytes: int | None = None     # activations saved for backward, at most
    peak_rss_bytes: int | None = None       # the process's peak resident set size so far
    peak_held_bytes: int | None = None      # interleaved: activations held across chunks, at most
    peak_held_chunks: int | None = None     # interleaved: chunks holding activations at once, at most

    def to_dict(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
