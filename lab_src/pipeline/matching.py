"""Which receive got which send: the arrows of the timeline.

A message is identified by (sender, receiver, direction, micro-batch), where the direction is
"forward" (an activation) or "backward" (a gradient). A `send_forward` on rank 1 to rank 2 for
micro-batch 3 pairs with the `recv_forward` on rank 2 from rank 1 for micro-batch 3. When the same
key occurs more than once (a step run twice, say), sends and receives pair in the order they started:
messages between two ranks in one direction arrive in the order they were sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab_src.pipeline.trace import Event


def message_key(e: Event) -> tuple:
    """(sender, receiver, direction, micro-batch) of a send or receive event."""
    return (e.rank, e.peer, e.phase, e.microbatch) if e.is_send else (e.peer, e.rank, e.phase, e.microbatch)


@dataclass
class Matching:
    pairs: list[tuple[Event, Event]] = field(default_factory=list)   # (send, receive), in send order
    lost_sends: list[Event] = field(default_factory=list)            # sends that no receive took
    orphan_recvs: list[Event] = field(default_factory=list)          # receives with no send

    @property
    def ok(self) -> bool:
        return not self.lost_sends and not self.orphan_recvs

    def problems(self) -> list[str]:
        """One line per unmatched event, naming its rank, operation and micro-batch."""
        lines = []
        for e in self.lost_sends:
            lines.append(f"rank {e.rank}: {e.kind} of micro-batch {e.microbatch} to rank {e.peer} "
                         f"has no matching {e.op.counterpart} on rank {e.peer}")
        for e in self.orphan_recvs:
            lines.append(f"rank {e.rank}: {e.kind} of micro-batch {e.microbatch} from rank {e.peer} "
                         f"has no matching {e.op.counterpart} on rank {e.peer}")
        return lines

    def __str__(self) -> str:
        head = f"{len(self.pairs)} messages matched"
        return head if self.ok else head + "; unmatched:\n  " + "\n  ".join(self.problems())


class UnmatchedMessages(AssertionError):
    """Raised by `check_matching` when some send or receive has no partner."""


def match(events: list[Event]) -> Matching:
    """Pair every send with its receive, and collect what is left over on either side."""
    ordered = sorted(events, key=lambda e: (e.t_start, e.rank))
    waiting: dict[tuple, list[Event]] = {}
    for e in ordered:
        if e.is_recv:
            waiting.setdefault(message_key(e), []).append(e)
    result = Matching()
    for e in ordered:
        if e.is_send:
            queue = waiting.get(message_key(e))
            if queue:
                result.pairs.append((e, queue.pop(0)))
            else:
                result.lost_sends.append(e)
    result.orphan_recvs = sorted((r for q in waiting.values() for r in q), key=lambda e: (e.t_start, e.rank))
    return result


def match_messages(events: list[Event]) -> list[tuple[Event, Event]]:
    """The (send, receive) pairs; unmatched events are left out (see `match` for them)."""
    return match(events).pairs


def check_matching(events: list[Event]) -> list[tuple[Event, Event]]:
    """The (send, receive) pairs; raises `UnmatchedMessages` naming every event without a partner."""
    result = match(events)
    if not result.ok:
        raise UnmatchedMessages(str(result))
    return result.pairs
