"""The calls a step makes to q11's `p2p_communicate`: the four single operations and the two combined ones.

A 1F1B steady state sends an output forward and at once waits for a gradient from the same neighbour,
then sends a gradient back and waits for the next activation from the other neighbour. Posting each
such pair together (one `batch_isend_irecv`) is what keeps two neighbours that both want to send first
from waiting on each other. The combined operations are those pairs:

    send_forward_recv_backward    send_forward(mb=a) and recv_backward(mb=b), both with the next stage
    send_backward_recv_forward    send_backward(mb=b) and recv_forward(mb=c), both with the previous stage

`calls(schedule, rank, p, m)` is a rank's program (pipeline/schedules.py) as calls of `p2p_communicate`:
a send immediately followed, with no compute between, by the receive from the same neighbour becomes
one combined call (picotron's 1F1B). The ends' no-ops are kept: a check calls them too.
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.pipeline.ops import COMBINED
from lab_src.pipeline.schedules import Op, Schedule
from lab_src.pipeline.schedules import schedule as schedule_named

OPERATIONS = tuple(o.value for o in Op if not o.is_compute) + tuple(COMBINED)


@dataclass(frozen=True)
class Call:
    """One call of p2p_communicate: `microbatch` of the tensor sent (or of a single receive),
    `recv_microbatch` of the tensor a combined operation receives."""
    operation: str
    microbatch: int
    recv_microbatch: int | None = None

    @property
    def parts(self) -> tuple[Op, ...]:
        """The single operations this call is made of."""
        return COMBINED.get(self.operation) or (Op(self.operation),)

    def microbatch_of(self, op: Op) -> int:
        return self.recv_microbatch if op.is_recv and self.recv_microbatch is not None else self.microbatch

    @property
    def receives(self) -> Op | None:
        return next((op for op in self.parts if op.is_recv), None)

    def __str__(self) -> str:
        if self.operation in COMBINED:
            return f"{self.operation}(mb={self.microbatch}, recv_mb={self.recv_microbatch})"
        return f"{self.operation}(mb={self.microbatch})"


def calls(sched: Schedule | str, rank: int, p: int, m: int, combined: bool = True) -> list[Call]:
    """Rank `rank`'s point-to-point calls in one step of `sched`, no-ops at the ends included."""
    sched = schedule_named(sched) if isinstance(sched, str) else sched
    program = sched.program(rank, p, m, noops=True)
    out: list[Call] = []
    i = 0
    while i < len(program):
        step = program[i]
        if step.op.is_compute:
            i += 1
            continue
        after = program[i + 1] if i + 1 < len(program) else None
        pair = next((name for name, (send, recv) in COMBINED.items()
                     if step.op is send and after is not None and after.op is recv), None)
        if combined and pair:
            out.append(Call(pair, step.microbatch, after.microbatch))
            i += 2
        else:
            out.append(Call(step.op.value, step.microbatch))
            i += 1
    return out
