"""A run's own schedule with emulated compute: what the student's step did, in the order it did it, with
every compute box given a length from a cost model instead of the wall clock of a shared CPU.

On a hub each student has 2 cores, and a study runs 4 ranks: while one rank computes, another waits for a
core, not for a message, and its boxes stretch by whatever else runs on the node. The measured bubble then
says more about the machine than about the schedule (issue 41: 1F1B's bubble swung from 10 % to 30 % for
one configuration, ZB-H1's came out above 1F1B's in 9 of 21 pairs). The replay keeps what the run decided
and drops what the machine did to it:

- each rank's operations in the order the rank ran them (its forwards, backwards, I's and W's, sends and
  receives, as recorded), and which message each receive took (the k-th send from rank a to rank b of
  micro-batch j in a phase is the k-th such receive);
- each compute box lasts the cost model's time for its kind, the same on every rank (`box_times`: the
  median of the run's own boxes of that kind, so F, I and W keep this model's proportions);
- a send keeps its sender busy for bytes / bandwidth and arrives `latency` later; a receive ends when its
  message has arrived. Nothing else takes time: no Python between boxes, no other process on the CPU.

A schedule's bubble in this replay is the schedule's own, whatever the load: with the reference's order it
is the schedule model's (views/ideal.py), and a student whose order differs sees their order's bubble.
Wherever it is shown it is labelled "emulated compute".

    emulated = emulated_events(events, p)                       # None where the run's messages do not match
    emulated = emulated_events(events, p, times={"forward": 2e-3, "backward": 4e-3})
"""
from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import replace

from lab_src.pipeline.ops import Op
from lab_src.pipeline.trace import Event
from lab_src.views.ideal import CostModel

LABEL = "emulated compute"


def box_times(events: list[Event]) -> dict[str, float]:
    """{kind: the median length of the run's compute boxes of that kind}, over every rank."""
    lengths: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.is_compute:
            lengths[e.kind].append(e.duration)
    return {kind: statistics.median(d) for kind, d in lengths.items()}


def describe_times(times: dict[str, float]) -> str:
    """'F 2.10 ms, I 1.80 ms, W 3.60 ms'."""
    order = [op for op in Op if op.is_compute and op.value in times]
    return ", ".join(f"{op.letter} {times[op.value] * 1e3:.2f} ms" for op in order)


def emulated_events(events: list[Event], p: int, times: dict[str, float] | None = None,
                    cost: CostModel = CostModel(), stage_layers: list[int] | None = None) -> list[Event] | None:
    """The run's events replayed with emulated compute (module docstring); None where a receive has no
    matching send (a run that did not finish), so that the replay cannot be drawn.

    `times`: {kind: seconds} per compute box (default: `box_times(events)`); `stage_layers`: the blocks
    each rank ran, which scales its boxes (a rank with twice the blocks computes twice as long); `cost`:
    the messages' latency and bandwidth."""
    times = dict(times or box_times(events))
    layers = list(stage_layers) if stage_layers and all(stage_layers) else None
    mean_layers = sum(layers) / len(layers) if layers else 1.0
    program = {r: _in_order([e for e in events if e.rank == r and (e.is_compute or e.is_send or e.is_recv)])
               for r in range(p)}
    next_op = {r: 0 for r in range(p)}
    free_at = {r: 0.0 for r in range(p)}
    arrivals: dict[tuple, deque] = defaultdict(deque)       # (src, dst, phase, mb) -> arrival times, in order
    out: list[Event] = []
    while any(next_op[r] < len(program[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while next_op[r] < len(program[r]):
                e, t = program[r][next_op[r]], free_at[r]
                if e.is_recv:
                    queue = arrivals[(e.peer, r, e.phase, e.microbatch)]
                    if not queue:
                        break                       # its message is not sent yet: another rank first
                    end = max(t, queue.popleft())
                elif e.is_send:
                    end = t + cost.transfer_s(e.bytes)
                    arrivals[(r, e.peer, e.phase, e.microbatch)].append(end + cost.latency_s)
                else:
                    if e.kind not in times:
                        return None
                    scale = layers[r] / mean_layers if layers and r < len(layers) else 1.0
                    end = t + times[e.kind] * scale
                out.append(replace(e, t_start=t, t_end=end))
                free_at[r] = end
                next_op[r] += 1
                progressed = True
        if not progressed:
            return None                              # a receive no send matches: the run did not finish
    return sorted(out, key=lambda e: (e.t_start, e.rank))


def _in_order(ops: list[Event]) -> list[Event]:
    """One rank's operations in the order it ran them. Messages in flight together (a send and a receive
    posted at once, as q11's send_forward_recv_backward does, their spans overlapping) are one group, its
    sends first: the rank did not wait for its receive before it sent."""
    ops = sorted(ops, key=lambda e: (e.t_start, e.t_end))
    out: list[Event] = []
    group: list[Event] = []
    for e in ops + [None]:
        if e is not None and not e.is_compute and group and e.t_start < max(g.t_end for g in group):
            group.append(e)
            continue
        out += sorted(group, key=lambda g: (not g.is_send, g.t_start))
        group = [] if e is None or e.is_compute else [e]
        if e is not None and e.is_compute:
            out.append(e)
    return out


def note(times: dict[str, float], cost: CostModel = CostModel()) -> str:
    """What the emulated view is, in one line, for its caption."""
    return (f"your run's operations in its order, each box the run's median of its kind "
            f"({describe_times(times)}), messages {cost.latency_s * 1e6:.0f} µs + bytes / "
            f"{cost.bandwidth_bytes_per_s / 1e9:g} GB/s; no CPU shared")
