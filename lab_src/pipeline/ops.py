"""The operations of a pipeline schedule, and one step of a rank's program, as data (no torch).

Each `Op` knows its name (the `kind` its events are recorded with: "forward", "send_forward", ...), its
letter in torch.distributed.pipelining's action grammar (F, B, I, W for compute; SEND_F, RECV_F, SEND_B,
RECV_B for messages, as torch's `_ComputationType` spells them), whether it computes, and what it does to
the micro-batches a rank holds for their backward (`holds`): a forward adds one, a backward releases it;
a backward split in two (zero bubble) keeps it held through its input-gradient part (I) until its
weight-gradient part (W) releases it. Views, judges and the deadlock report take letters and counts from
here, so an operation added to `Op` prints and counts without touching them.

A rank runs `v` model chunks (v = 1 except for interleaved schedules): chunk c of rank r is virtual stage
s = c * p + r of `v * p`, and virtual stage s + 1 lives on rank (s + 1) % p. Activations travel from
virtual stage s to s + 1 (forward), gradients from s + 1 back to s (backward). Everything that needs to
know who talks to whom asks `Op.peer`; nothing else in the lab takes an operation's name apart.

A `Step` prints as torch's actions do, virtual stage, letter, micro-batch, and reads back:

    str(Step(2, Op.FORWARD, 0))          # '2F0'
    Step.parse("5B3", p=4)               # the backward of micro-batch 3 on virtual stage 5: chunk 1 of rank 1
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Op(str, enum.Enum):
    """An operation: its value is its name, the `kind` of its events."""

    #                   name               letter    phase       computes holds chained after
    FORWARD =         ("forward",         "F",      "forward",  True,    +1,   True,   None)
    BACKWARD =        ("backward",        "B",      "backward", True,    -1,   True,   "forward")
    BACKWARD_INPUT =  ("backward_input",  "I",      "backward", True,    0,    True,   "forward")
    BACKWARD_WEIGHT = ("backward_weight", "W",      "backward", True,    -1,   False,  "backward_input")
    RECV_FORWARD =    ("recv_forward",    "RECV_F", "forward")
    SEND_FORWARD =    ("send_forward",    "SEND_F", "forward")
    RECV_BACKWARD =   ("recv_backward",   "RECV_B", "backward")
    SEND_BACKWARD =   ("send_backward",   "SEND_B", "backward")

    def __new__(cls, name: str, letter: str, phase: str, computes: bool = False, holds: int = 0,
                chained: bool = False, after: str | None = None):
        op = str.__new__(cls, name)
        op._value_ = name
        op.letter = letter          # torch's action letter: 'F', 'B', 'I', 'W', 'SEND_F', ...
        op.phase = phase            # "forward" for what activations do, "backward" for what gradients do
        op.is_compute = computes
        op.holds = holds            # change in the micro-batches held for their backward when it runs
        op.chained = chained        # its input is the same operation's output on the neighbouring stage
        op._after = after           # the operation of the same stage and micro-batch whose work it continues
        return op

    def __str__(self) -> str:
        return self.value

    @classmethod
    def of(cls, kind) -> "Op | None":
        """The operation named `kind` ("recv_forward", Op.FORWARD, ...), or None for another kind of event."""
        try:
            return cls(kind)
        except ValueError:
            return None

    @classmethod
    def lettered(cls, letter: str) -> "Op":
        """The operation whose letter is `letter` ("F", "SEND_B", ...)."""
        found = next((op for op in cls if op.letter == letter), None)
        if found is None:
            raise ValueError(f"no operation has the letter {letter!r}")
        return found

    @property
    def after(self) -> "Op | None":
        """The operation it continues on the same stage and micro-batch (a backward continues the forward,
        W the I that kept its micro-batch held), or None."""
        return Op(self._after) if self._after else None

    @property
    def is_send(self) -> bool:
        return self in (Op.SEND_FORWARD, Op.SEND_BACKWARD)

    @property
    def is_recv(self) -> bool:
        return self in (Op.RECV_FORWARD, Op.RECV_BACKWARD)

    @property
    def towards_next(self) -> bool:
        """True when the peer is the next (virtual) stage: activations go to it, gradients come from it."""
        return self in (Op.SEND_FORWARD, Op.RECV_BACKWARD)

    @property
    def counterpart(self) -> "Op":
        """The operation on the peer that completes this one (send_forward <-> recv_forward, ...)."""
        return {Op.SEND_FORWARD: Op.RECV_FORWARD, Op.RECV_FORWARD: Op.SEND_FORWARD,
                Op.SEND_BACKWARD: Op.RECV_BACKWARD, Op.RECV_BACKWARD: Op.SEND_BACKWARD}.get(self, self)

    def is_noop(self, rank: int, p: int, chunk: int = 0, v: int = 1) -> bool:
        """True where the operation has no peer: before the first or after the last virtual stage."""
        if self.is_compute:
            return False
        stage = chunk * p + rank
        return stage == v * p - 1 if self.towards_next else stage == 0

    def peer(self, rank: int, p: int, chunk: int = 0, v: int = 1) -> int | None:
        """The rank this operation talks to (None for compute and for the no-ops at the ends)."""
        if self.is_compute or self.is_noop(rank, p, chunk, v):
            return None
        return (rank + 1) % p if self.towards_next else (rank - 1) % p

    def peer_chunk(self, rank: int, p: int, chunk: int = 0) -> int:
        """The chunk of the peer's virtual stage: the next one may sit on the first rank's next chunk."""
        if self.towards_next:
            return chunk + 1 if rank == p - 1 else chunk
        return chunk - 1 if rank == 0 else chunk

    def describe_peer(self, rank: int, p: int) -> str:
        """'activations go to the next stage, rank 2' and the like, for messages about a wrong peer."""
        what = {Op.SEND_FORWARD: "activations go to", Op.RECV_FORWARD: "activations come from",
                Op.SEND_BACKWARD: "gradients go back to", Op.RECV_BACKWARD: "gradients come back from"}[self]
        want = self.peer(rank, p)
        where = "the next stage" if self.towards_next else "the previous stage"
        return f"{what} {where}, rank {want}"


def letters(compute, limit: int = 12) -> str:
    """'F0 F1 B0 ...' of (operation or its name, micro-batch) pairs, the first `limit` of them."""
    text = " ".join(f"{Op(kind).letter}{mb}" for kind, mb in compute[:limit])
    return text + (" ..." if len(compute) > limit else "")


_ACTION = re.compile(r"(\d+)(%s)(\d+)" % "|".join(sorted((op.letter for op in Op), key=len, reverse=True)))


@dataclass(frozen=True)
class Step:
    """One operation of a rank's program: on virtual stage `stage` (chunk * p + rank), for `microbatch`."""
    stage: int
    op: Op
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        """torch's action grammar: stage, letter, micro-batch ('2F0', '0B3', '1SEND_F2')."""
        return f"{self.stage}{self.op.letter}{self.microbatch}"

    @classmethod
    def parse(cls, text: str, p: int | None = None) -> "Step":
        """The step `text` ('2F0') names; its chunk is stage // p, or 0 where `p` is not given (one chunk
        per rank)."""
        found = _ACTION.fullmatch(text.strip())
        if found is None:
            raise ValueError(f"{text!r} is not an action such as '2F0' (stage, letter, micro-batch)")
        stage, letter, mb = found.groups()
        return cls(int(stage), Op.lettered(letter), int(mb), int(stage) // p if p else 0)


# The two combined operations of q11's `p2p_communicate`: a send and, with no compute between, the receive from the
# same neighbour, posted together (topics/p2p/calls.py; comm/messages.py splits them into their messages)
COMBINED = {"send_forward_recv_backward": (Op.SEND_FORWARD, Op.RECV_BACKWARD),
            "send_backward_recv_forward": (Op.SEND_BACKWARD, Op.RECV_FORWARD)}
