"""Q17's run on a time axis: every tensor-parallel rank's collectives, drawn as q14's all-reduces are (bars
joined across their group, views/static.py), one row per rank.

The events are what the ranks recorded (topics/tensor_parallel/rawcoll.py: the answer's own torch.distributed calls); the
parts of the case ran one after another (copy, reduce, column, row, mlp; topics/tensor_parallel/kind_layers.py), so the
bars come in that order, each part's forward before its backward.
"""
from __future__ import annotations

from lab_src.pipeline.trace import Event


def tp_timeline_figure(events: list[Event], t: int, title: str = "", parts=()):
    """The static figure of one q17 case on `t` ranks."""
    from lab_src.views.prepare import prepare
    from lab_src.views.static import TimelineFigure, draw, legend_handles
    tl = prepare(events, t, 1, align=False)
    fig = TimelineFigure(figsize=(11, 1.6 + 0.5 * t), layout="constrained")
    ax = fig.subplots()
    draw(ax, tl)
    ax.set_yticks(range(t), [f"rank {r}" for r in range(t)], fontsize=8)
    calls = sum(1 for e in events if e.is_collective and e.rank == 0)
    order = f" · the parts, in order: {', '.join(parts)}" if parts else ""
    ax.set_title(f"{calls} collective{'s' if calls != 1 else ''} on rank 0{order}", fontsize=9.5, loc="left")
    ax.set_xlabel("time since the case started (ms)")
    if title:
        fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    kinds = tuple(sorted({e.kind for e in events if e.is_collective}))
    fig.legend(handles=legend_handles(kinds), loc="outside lower center", ncol=4, fontsize=8, frameon=False)
    return fig


def show_tp_timeline(events: list[Event], t: int, title: str = "", parts=()):
    """The animated timeline of one q17 case (the collectives step by step, as q14's widget steps through its
    all-reduces); the static figure while autograding."""
    import os
    if os.environ.get("NBGRADER_EXECUTION"):
        return tp_timeline_figure(events, t, title, parts)
    from lab_src.views.prepare import prepare
    from lab_src.views.widget import TimelineWidget

    class CollectivesWidget(TimelineWidget):
        def _side_panel(self) -> str:
            return collectives_panel(self.view.events, t, parts)

    return CollectivesWidget(prepare(events, t, 1, align=False), None, title=title)


def collectives_panel(events: list[Event], t: int, parts=()) -> str:
    """The widget's side panel: per rank, the collectives its code made and the bytes it handed to them."""
    from html import escape
    rows = "".join(
        f"<tr><td>rank {r}</td><td style='text-align:right'>{sum(1 for e in events if e.rank == r and e.is_collective)}"
        f"</td><td style='text-align:right'>{sum(e.bytes for e in events if e.rank == r and e.is_collective):,} B</td></tr>"
        for r in range(t))
    kinds = sorted({e.kind for e in events if e.is_collective})
    order = f"The parts ran one after another: {', '.join(parts)}; each part's forward before its backward." if parts else ""
    return (f'<div class="pp-timeline-side" style="font-size:12px; line-height:1.45">'
            f"<b>Collectives</b> ({escape(', '.join(kinds)) or 'none'})<table>"
            f"<tr><td></td><td>calls</td><td>bytes handed</td></tr>{rows}</table><br>"
            f"<div style='color:#555'>{escape(order)} {escape(lesson(parts))}</div></div>")


def lesson(parts=()) -> str:
    """What a right answer's collectives look like, for the parts the case ran (q17's or q18's)."""
    if "block" in parts or "dropout" in parts:
        return ("A correct block makes one all-reduce of the activation after its attention and one after its MLP "
                "in the forward, and one before each in the backward, on every rank.")
    return "A correct MLP makes one all-reduce of the activation in its forward and one in its backward, on every rank."
