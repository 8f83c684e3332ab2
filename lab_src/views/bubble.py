"""The pipeline bubble: the share of the step in which stages sit idle.

For All-Forward-All-Backward with p stages and m micro-batches, if every stage takes the same time
for a forward and the same for a backward and messages are free, the bubble is (p-1)/(m+p-1).
The measured bubble is one minus the time ranks spent computing, over p times the step's span.
"""
from __future__ import annotations

from lab_src.pipeline.trace import Event


def theoretical_bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def measured_bubble(events: list[Event], p: int) -> float | None:
    if not events:
        return None
    span = max(e.t_end for e in events) - min(e.t_start for e in events)
    if span <= 0:
        return None
    busy = sum(e.duration for e in events if e.is_compute)
    return max(0.0, 1.0 - busy / (p * span))


def bytes_sent(events: list[Event], p: int) -> dict[int, int]:
    return {r: sum(e.bytes for e in events if e.rank == r and e.is_send) for r in range(p)}


def describe(events: list[Event], p: int, m: int) -> str:
    measured = measured_bubble(events, p)
    theory = theoretical_bubble(p, m)
    got = f"{measured:.1%}" if measured is not None else "n/a"
    return f"bubble: measured {got}, theory (p-1)/(m+p-1) = ({p}-1)/({m}+{p}-1) = {theory:.1%}"
