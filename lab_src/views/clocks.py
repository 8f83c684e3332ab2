"""Put every rank on one clock, using the messages themselves.

Ranks on one host share its monotonic clock (lab_src/pipeline/trace.py), so there is normally nothing to do.
Ranks on different hosts do not, and a receive cannot finish before its send has started, so every
message says something about the offset between its two ranks' clocks:

    (offset of receiver) - (offset of sender) >= send.t_start - recv.t_end

Forward messages bound the offset between neighbours from below, backward messages from above. We
shift each rank by the smallest amount that satisfies all of them (nothing, if the clocks already
agree), so that no arrow of the timeline points back in time.
"""
from __future__ import annotations

from dataclasses import replace

from lab_src.pipeline.trace import Event


def clock_offsets(pairs: list[tuple[Event, Event]], p: int) -> dict[int, float]:
    """Seconds to add to each rank's times; rank 0 stays put. Only neighbouring ranks are compared."""
    offsets = {0: 0.0}
    for r in range(p - 1):
        low, high = float("-inf"), float("inf")   # bounds on offset[r+1] - offset[r]
        for send, recv in pairs:
            if (send.rank, recv.rank) == (r, r + 1):
                low = max(low, send.t_start - recv.t_end)
            elif (send.rank, recv.rank) == (r + 1, r):
                high = min(high, recv.t_end - send.t_start)
        if low <= high:
            step = min(max(0.0, low), high)
        else:                                      # contradictory: split the difference
            step = (low + high) / 2
        offsets[r + 1] = offsets[r] + step
    return offsets


def shift(events: list[Event], offsets: dict[int, float]) -> list[Event]:
    return [replace(e, t_start=e.t_start + offsets.get(e.rank, 0.0), t_end=e.t_end + offsets.get(e.rank, 0.0))
            if offsets.get(e.rank, 0.0) else e for e in events]
