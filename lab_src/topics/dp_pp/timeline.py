"""Pictures of a run on a data-parallel x pipeline-parallel grid (q14): every rank of every replica on one
time axis, forward and backward boxes, messages as arrows, all-reduces as bars joined across their group.

The ranks record messages with pipeline ranks as peers (a stage talks within its pipeline group);
`global_events` names the peers by global rank, so that the arrows of replica 1 land on replica 1's rows.
Row labels give each rank's coordinates: "rank 3 (dp 1, pp 1)".
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from lab_src.pipeline.trace import Event
from lab_src.views.prepare import Timeline


@dataclass
class GridTimeline(Timeline):
    """A timeline of all the grid's ranks (p = dp x pp rows) whose theory is one pipeline's, (pp-1)/(m+pp-1)."""
    pp: int = 0

    @property
    def pipeline_p(self) -> int:
        return self.pp or self.p

    @property
    def theory(self) -> float:
        from lab_src.views.bubble import theoretical_bubble
        return theoretical_bubble(self.pipeline_p, self.m)


def grid_timeline(events: list[Event], dp: int, pp: int, m: int, **how) -> GridTimeline:
    from lab_src.views.prepare import prepare
    tl = prepare(events, dp * pp, m, **how)
    tl.row_notes = [f"dp {r // pp}, pp {r % pp}" for r in range(dp * pp)]
    return GridTimeline(**{k: getattr(tl, k) for k in tl.__dataclass_fields__}, pp=pp)


def predicted_events(measured: list[Event], dp: int, pp: int, m: int, net, stage_layers: list[int] | None,
                     sizes: dict, tied: bool) -> list[Event]:
    """The step as the traffic model sees it: each replica's pipeline as the schedule's ideal step (compute
    from the measured run's averages, messages on `net`), then the tied and the data-parallel all-reduces,
    each starting when the last of its members is ready, one buffer per stage."""
    from lab_src.views.ideal import CostModel, calibrate, ideal_events
    base = CostModel(latency_s=net.intra.latency_s, bandwidth_bytes_per_s=net.intra.bandwidth_Bps)
    replica0 = [e for e in measured if e.rank < pp]
    cost = calibrate(replica0, pp, stage_layers, base)
    shape = next((e.shape for e in measured if e.is_send), None)
    one = ideal_events(pp, m, cost, schedule="afab", stage_layers=stage_layers, activation_bytes=sizes["message_bytes"],
                       shape=shape)
    events = [replace(e, rank=e.rank + d * pp, peer=None if e.peer is None else e.peer + d * pp)
              for d in range(dp) for e in one]
    ready = {r: max((e.t_end for e in events if e.rank == r), default=0.0) for r in range(dp * pp)}

    def reduce(kind: str, group: list[int], nbytes: float) -> None:
        start = max(ready[r] for r in group)
        end = start + net.allreduce_s(group, nbytes)
        for r in group:
            events.append(Event(r, kind, None, None, None, int(nbytes), start, end, 0, group=tuple(group)))
            ready[r] = end

    if tied and pp > 1 and sizes["tied_bytes"]:
        for d in range(dp):
            reduce("allreduce_tied", [d * pp, d * pp + pp - 1], sizes["tied_bytes"])
    if dp > 1:
        for p in range(pp):
            reduce("allreduce_dp", [d * pp + p for d in range(dp)], sizes["stage_bytes"][p])
    return sorted(events, key=lambda e: (e.t_start, e.rank))


def global_events(events: list[Event], pipeline_of: dict[int, list[int]]) -> list[Event]:
    """`events` with every message's peer turned from a pipeline rank into a global rank, using each
    rank's pipeline group (global ranks in pipeline order); collectives and compute are unchanged."""
    out = []
    for e in events:
        group = pipeline_of.get(e.rank)
        if (e.is_send or e.is_recv) and e.peer is not None and group and 0 <= e.peer < len(group):
            e = replace(e, peer=group[e.peer])
        out.append(e)
    return out


def row_labels(dp: int, pp: int) -> list[str]:
    return [f"rank {r} (dp {r // pp}, pp {r % pp})" for r in range(dp * pp)]


def grid_figure(measured: list[Event], dp: int, pp: int, m: int, title: str = "", predicted: list[Event] | None = None,
                note: str = ""):
    """The static figure: the measured run, and under it what the traffic model predicts, if given."""
    from lab_src.views.memory import draw_state_lane, has_state
    from lab_src.views.scene import legend_of
    from lab_src.views.static import TimelineFigure, draw, handles
    world = dp * pp
    panels = [grid_timeline(measured, dp, pp, m)]
    if predicted is not None:
        panels.append(grid_timeline(predicted, dp, pp, m, kind="predicted", note=note, align=False))
    lane = has_state(panels[0])         # the sharding kinds: the memory lane by kind, under the measured run
    heights = [0.45 * world + 1.1] * len(panels) + ([0.35 * world + 0.8] if lane else [])
    fig = TimelineFigure(figsize=(11, 0.6 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(heights), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    if lane:
        draw_state_lane(axes[-1], panels[0])
        axes[-1].set_yticks([world - 1 - r + 0.4 for r in range(world)], row_labels(dp, pp), fontsize=8)
    for ax, tl in zip(axes, panels):
        draw(ax, tl)
        ax.set_yticks(range(world), row_labels(dp, pp), fontsize=8)
        ax.set_title(f"{tl.kind}: step {tl.span * 1e3:.1f} ms · {bubble_text(tl, pp, m)}"
                     + (f"\n{tl.kind}: {tl.note}" if tl.note else ""), fontsize=9.5, loc="left")
    axes[-1].set_xlabel("time since the step started (ms)")
    if title:
        fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    fig.legend(handles=handles(legend_of(panels)), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    return fig


def show_grid(measured: list[Event], dp: int, pp: int, m: int, title: str = "", predicted: list[Event] | None = None,
              note: str = ""):
    """The animated timeline (measured, and the model's prediction as its second view); the static figure
    while autograding or when there is no prediction."""
    if os.environ.get("NBGRADER_EXECUTION") or predicted is None:
        return grid_figure(measured, dp, pp, m, title, predicted, note)
    from lab_src.views.widget import TimelineWidget
    return TimelineWidget(grid_timeline(measured, dp, pp, m),
                          grid_timeline(predicted, dp, pp, m, kind="ideal", note=note, align=False), title=title)


def bubble_text(tl, pp: int, m: int) -> str:
    """The grid's idle share beside one pipeline's theory, (pp-1)/(m+pp-1): the all-reduces at the end of
    the step are idle time the pipeline's formula does not count. A grid of one stage (q21's first case) is no
    pipeline: its idle time is said alone, with where it went (prepare.Timeline.idle_text)."""
    if pp < 2:
        return tl.idle_text()
    got = "n/a" if tl.bubble is None else f"{tl.bubble:.1%}"
    return (f"idle {got} of the ranks' time vs one pipeline's theory (pp-1)/(m+pp-1) = ({pp}-1)/({m}+{pp}-1) = "
            f"{tl.theory:.1%}")
