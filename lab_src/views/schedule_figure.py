"""Schedules side by side, drawn from the schedule model (pipeline/schedules.py) before any code runs.

    schedule_figure(("afab", "1f1b"), p=4, m=8)

One panel per schedule: its ideal step (views/ideal.py: every layer costs the same, a backward twice a
forward, messages free), one row per rank, and under it a lane with the micro-batches each rank holds
awaiting their backward. The notebooks open with it (q11, q12), so that the order of the operations,
the bubble and the memory are seen before they are measured.
"""
from __future__ import annotations

import math

from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event
from lab_src.views.ideal import CostModel, ideal_events
from lab_src.views.prepare import prepare

# Compute only: the schedule's shape, without any cost of messaging.
FREE_MESSAGES = CostModel(forward_s_per_layer=1e-3, backward_s_per_layer=2e-3, latency_s=0.0,
                          bandwidth_bytes_per_s=math.inf)


def with_in_flight(events: list[Event]) -> list[Event]:
    """The events with `held` set to the micro-batches the rank holds awaiting their backward (`Op.holds`)."""
    from lab_src.views.memory import holding
    return holding(events)


def schedule_figure(names=("afab", "1f1b"), p: int = 4, m: int = 8, cost: CostModel = FREE_MESSAGES,
                    title: str | None = None, bubbles: bool = True):
    """A matplotlib figure: for each schedule, its ideal step and the micro-batches each rank holds.
    `bubbles=False`: the titles leave the bubbles out (the figure sits above a prediction of them)."""
    from lab_src.views.static import figure
    timelines = []
    for name in names:
        sched = schedule(name)
        events = with_in_flight(ideal_events(p, m, cost, schedule=sched))
        held = [max((e.held for e in events if e.rank == r), default=0) for r in range(p)]
        note = (f"every layer costs the same, a backward twice a forward, messages free; most micro-batches "
                f"held per rank: {' / '.join(map(str, held))}")
        timelines.append(prepare(events, p, m, kind=sched.title, note=note, align=False))
        timelines[-1].hide_bubble = not bubbles
    if title is None:
        title = f"{' vs '.join(schedule(n).title for n in names)}: {p} stages, {m} micro-batches (the schedule model)"
    return figure(timelines, title, memory_unit="micro-batches")
