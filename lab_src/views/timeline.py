"""The P2P timeline of a pipeline run: what every rank did, and when.

    from lab_src.views.timeline import show
    show(events, p, m)               # in a notebook: the animated widget (measured / ideal toggle)

From the events a run recorded (lab_src.pipeline.trace.Event), every rank gets a row on a measured time axis:
forward and backward boxes per micro-batch, an arrow from each send to its matching receive, and the
idle time in between (the bubble). The ideal view draws the run's schedule (pipeline/schedules.py) under a simple cost
model (ideal.py). While nbgrader autogrades (NBGRADER_EXECUTION is set) no widget is made: `show`
returns the static matplotlib figure instead (static.py).

    pipeline/matching.py  which receive got which send; unmatched ones reported by rank, micro-batch, op
    clocks.py    align the ranks' clocks so that no message arrives before it was sent
    ideal.py     a schedule's step under a cost model (equal compute per layer, latency + bandwidth)
    prepare.py   a run prepared for drawing: sorted steps, bubble, bytes sent
    scene.py     what a panel shows and its legend, decided once for both drawings
    static.py    matplotlib figure          svg.py    one animation frame    widget.py  the ipywidgets view
    memory.py    the memory lane under the ranks (bytes each rank holds for its backwards)
    schedule_figure.py  schedules drawn from the schedule model       experiments.py  Q12's memory and bubble plots

Importing this package loads neither matplotlib nor ipywidgets: each is imported when first used.
"""
from __future__ import annotations

import os

from lab_src.pipeline import schedules
from lab_src.pipeline.trace import Event
from lab_src.views.prepare import Timeline, prepare
from lab_src.views.ideal import CostModel, calibrate, ideal_events
from lab_src.pipeline.matching import Matching, UnmatchedMessages, check_matching, match, match_messages


def timelines(events: list[Event], p: int, m: int, *, schedule: str = "afab", activation_bytes: int | None = None,
              stage_layers: list[int] | None = None, cost: CostModel | None = None, waits: list[Event] = (),
              ends=(), verdict: str = "", emulate: dict | None = None) -> tuple[Timeline, Timeline]:
    """(measured, ideal) for one run of `schedule`. `stage_layers` is the number of blocks each rank
    ran, as the run recorded it. The ideal's compute comes from `cost`, else from the run itself.
    `waits`, `ends`, `verdict`: where a run that did not finish left its ranks (prepare.Timeline).
    `emulate`: {kind: seconds} of each compute box ({} for the run's own medians): the second view is then
    this run's own order with emulated compute (views/emulated.py) instead of the schedule model's step."""
    v = schedules.schedule(schedule).chunks_per_rank if isinstance(schedule, str) else schedule.chunks_per_rank
    if emulate is not None and not waits and not verdict:
        from lab_src.views import emulated
        times = emulate or emulated.box_times(events)
        replayed = emulated.emulated_events(events, p, times, stage_layers=stage_layers)
        if replayed:
            return (prepare(events, p, m, chunks=v),
                    prepare(replayed, p, m, kind=emulated.LABEL, note=emulated.note(times), align=False, chunks=v))
    messages = [e for e in events if e.is_send or e.is_recv]
    if activation_bytes is None:
        activation_bytes = max((e.bytes for e in messages), default=0)
    shape = next((e.shape for e in messages), None)
    source = ""
    if cost is None:
        cost = calibrate(events, p, stage_layers)
        source = " (averages of the measured run)" if any(e.is_compute for e in events) else ""
    note = cost.describe(p, sum(stage_layers) if stage_layers else None, source)
    from lab_src.views.memory import modelled
    ideal = modelled(ideal_events(p, m, cost, schedule=schedule, stage_layers=stage_layers,
                                  activation_bytes=activation_bytes, shape=shape), events, p)
    return (prepare(events, p, m, chunks=v, waits=waits, ends=ends, verdict=verdict),
            prepare(ideal, p, m, kind="ideal", note=note, align=False, chunks=v))


def static_figure(events: list[Event], p: int, m: int, *, title: str = "", with_ideal: bool = True,
                  compute_free: str = "", **how):
    """A matplotlib Figure: the measured timeline, and below it the ideal one on the same time axis.
    `how`: the keyword arguments of `timelines` (schedule, activation_bytes, stage_layers, cost).
    `compute_free`: a run of messages with no schedule and no compute (q19's ring): the measured run alone,
    nothing drawn as a bubble, and this said in its place."""
    from lab_src.views.static import figure
    if compute_free:
        return figure([messages_only(events, p, m, compute_free, **how)], title)
    measured, ideal = timelines(events, p, m, **how)
    return figure([measured, ideal] if with_ideal else [measured], title)


def messages_only(events: list[Event], p: int, m: int, compute_free: str, waits: list[Event] = (), ends=(),
                  verdict: str = "", marked=(), sections=(), **_) -> Timeline:
    """The measured timeline of a run of messages alone (no schedule to model, no compute, no bubble);
    `marked`: (event, words) to point out; `sections`: (words, [indices into `events`]) to name above the run."""
    tl = prepare(events, p, m, waits=waits, ends=ends, verdict=verdict, marked=marked, sections=sections)
    tl.compute_free = compute_free
    return tl


def show(events: list[Event], p: int, m: int, *, title: str = "", compute_free: str = "", **how):
    """The animated timeline widget; while autograding, the static figure instead (no widgets).
    `compute_free`: a run of messages alone (static_figure), drawn without a second view."""
    if os.environ.get("NBGRADER_EXECUTION"):
        return static_figure(events, p, m, title=title, compute_free=compute_free, **how)
    from lab_src.views.widget import TimelineWidget
    if compute_free:
        return TimelineWidget(messages_only(events, p, m, compute_free, **how), None, title=title)
    measured, ideal = timelines(events, p, m, **how)
    return TimelineWidget(measured, ideal, title=title)


__all__ = ["show", "static_figure", "ideal_events", "timelines", "CostModel", "calibrate", "match",
           "match_messages", "check_matching", "Matching", "UnmatchedMessages", "Timeline", "prepare"]
