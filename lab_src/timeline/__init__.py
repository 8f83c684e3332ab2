"""The P2P timeline of a pipeline run: what every rank did, and when.

    from lab_src.timeline import show
    show(events, p, m)               # in a notebook: the animated widget (measured / ideal toggle)

From the events a run recorded (lab_src.trace.Event), every rank gets a row on a measured time axis:
forward and backward boxes per micro-batch, an arrow from each send to its matching receive, and the
idle time in between (the bubble). The ideal view draws the same AFAB schedule under a simple cost
model (ideal.py). While nbgrader autogrades (NBGRADER_EXECUTION is set) no widget is made: `show`
returns the static matplotlib figure instead (static.py).

    matching.py  which receive got which send; unmatched ones reported by rank, micro-batch, op
    clocks.py    align the ranks' clocks so that no message arrives before it was sent
    ideal.py     the AFAB step under a cost model (equal compute per layer, latency + bandwidth)
    data.py      a run prepared for drawing: sorted steps, bubble, bytes sent
    static.py    matplotlib figure          svg.py    one animation frame    widget.py  the ipywidgets view

Importing this package loads neither matplotlib nor ipywidgets: each is imported when first used.
"""
from __future__ import annotations

import os

from ..trace import Event
from .data import Timeline, prepare
from .ideal import CostModel, calibrate, ideal_events
from .matching import Matching, UnmatchedMessages, check_matching, match, match_messages


def timelines(events: list[Event], p: int, m: int, *, activation_bytes: int | None = None,
              num_layers: int | None = None, cost: CostModel | None = None) -> tuple[Timeline, Timeline]:
    """(measured, ideal) for one run. The ideal's compute comes from `cost`, else from the run itself."""
    messages = [e for e in events if not e.is_compute]
    if activation_bytes is None:
        activation_bytes = max((e.bytes for e in messages), default=0)
    shape = next((e.shape for e in messages), None)
    source = ""
    if cost is None:
        cost = calibrate(events, p, num_layers)
        source = " (averages of the measured run)" if any(e.is_compute for e in events) else ""
    note = cost.describe(p, num_layers, source)
    ideal = ideal_events(p, m, cost, num_layers=num_layers, activation_bytes=activation_bytes, shape=shape)
    return prepare(events, p, m), prepare(ideal, p, m, kind="ideal", note=note, align=False)


def static_figure(events: list[Event], p: int, m: int, *, title: str = "", activation_bytes: int | None = None,
                  num_layers: int | None = None, cost: CostModel | None = None, with_ideal: bool = True):
    """A matplotlib Figure: the measured timeline, and below it the ideal one on the same time axis."""
    from .static import figure
    measured, ideal = timelines(events, p, m, activation_bytes=activation_bytes, num_layers=num_layers, cost=cost)
    return figure([measured, ideal] if with_ideal else [measured], title)


def show(events: list[Event], p: int, m: int, *, title: str = "", activation_bytes: int | None = None,
         num_layers: int | None = None, cost: CostModel | None = None):
    """The animated timeline widget; while autograding, the static figure instead (no widgets)."""
    if os.environ.get("NBGRADER_EXECUTION"):
        return static_figure(events, p, m, title=title, activation_bytes=activation_bytes,
                             num_layers=num_layers, cost=cost)
    from .widget import TimelineWidget
    measured, ideal = timelines(events, p, m, activation_bytes=activation_bytes, num_layers=num_layers, cost=cost)
    return TimelineWidget(measured, ideal, title=title)


__all__ = ["show", "static_figure", "ideal_events", "timelines", "CostModel", "calibrate", "match",
           "match_messages", "check_matching", "Matching", "UnmatchedMessages", "Timeline", "prepare"]
