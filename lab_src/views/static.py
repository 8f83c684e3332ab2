"""The timeline as a matplotlib figure, for when there is no live kernel (autograding, feedback, docs).

One row per rank on a time axis in milliseconds: forward and backward boxes labelled with their
micro-batch, thin bars for sends and receives, an arrow from each send to its receive, and hatched
idle time (the bubble). The title of each panel gives the bubble next to (p-1)/(m+p-1).

What a panel shows, and the legend, is decided by views/scene.py (the same scene the widget's frames paint);
this module paints its primitives with matplotlib.
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lab_src.views import scene as sc
from lab_src.views.prepare import COLORS, Timeline


class TimelineFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in a notebook even without pyplot."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100)
        return buf.getvalue()


def draw(ax, tl: Timeline, t_max: float | None = None) -> None:
    """Draw one timeline on `ax`; the axis ends at `t_max` seconds (default: the end of the step, and
    for a run that did not finish a little more, for where its ranks were left waiting)."""
    paint(ax, sc.scene(tl, t_max))


def paint(ax, s: sc.Scene) -> None:
    """Paint a scene (scene.py) on `ax`, time in ms: each primitive as matplotlib calls, nothing decided here
    but how a primitive looks on a figure (and whether a label fits its box, by this figure's font)."""
    ms, red = 1e3, COLORS["wait"]
    t_max = s.t_max
    for h in s.shades:
        ax.barh(h.row, (h.t1 - h.t0) * ms, left=h.t0 * ms, height=h.height, color=COLORS["idle"], hatch="///",
                edgecolor="#d4d4d4", lw=0)
    for b in s.boxes:
        ax.barh(b.row, (b.t1 - b.t0) * ms, left=b.t0 * ms, height=b.height, color=b.colour,
                **(dict(edgecolor="white", lw=0.5) if b.edge else {}))
        if b.label and b.t1 - b.t0 > max(0.016, 0.0065 * len(b.label)) * t_max:   # only a label that fits
            ax.text((b.t0 + b.t1) / 2 * ms, b.label_row, b.label, ha="center", va="center", color="white",
                    fontsize=7.5, fontweight="bold")
    for j in s.joins:
        ax.plot([j.t * ms, j.t * ms], [j.row0, j.row1], color=j.colour, lw=1.2, ls=":", alpha=0.9)
    for a in s.arrows:
        if a.lost:
            ax.plot([a.t0 * ms, a.t1 * ms], [a.row0, a.row1], color=a.colour, lw=1, linestyle="--")
            ax.text(a.t1 * ms, a.row1, "✕", color=a.colour, fontsize=9, ha="center", va="center")
        else:
            ax.annotate("", xy=(a.t1 * ms, a.row1), xytext=(a.t0 * ms, a.row0),
                        arrowprops=dict(arrowstyle="-|>", color=a.colour, lw=0.9, alpha=0.8, shrinkA=0, shrinkB=0,
                                        mutation_scale=8))
    for w in s.waits:
        ax.barh(w.row, (w.t1 - w.t0) * ms, left=w.t0 * ms, height=sc.WAIT, color=red, alpha=0.13, edgecolor=red,
                lw=1.2, linestyle="--")
        if (t_max - w.t0) > 0.007 * t_max * (len(w.label) + len(w.until) + 4):    # room for both in the bar
            ax.text((w.t0 + 0.004 * t_max) * ms, w.row, w.label, va="center", ha="left", color=red, fontsize=7.5,
                    clip_on=True)
            if w.until:
                ax.text(t_max * ms, w.row, w.until, va="center", ha="right", color=red, fontsize=7, clip_on=True)
        else:                                  # a wait that began late: one line, ending at the edge
            ax.text(t_max * ms, w.row, " · ".join(filter(None, [w.label, w.until])), va="center", ha="right",
                    color=red, fontsize=7, clip_on=True, bbox=dict(facecolor="white", edgecolor="none", alpha=0.85,
                                                                   pad=1))
    for c in s.crosses:
        ax.text(c.t * ms, c.row, "✕", color=red, fontsize=12, fontweight="bold", ha="center", va="center")
        ax.text(c.t * ms, c.row - sc.BOX / 2, f" {c.words}", color=red, fontsize=7.5, ha="left", va="bottom")
    for k in s.marks:                    # what the run points out: outlined, and said above it
        ax.barh(k.row, (k.t1 - k.t0) * ms, left=k.t0 * ms, height=k.height, fill=False, edgecolor=red, lw=1.6)
        ax.text(k.t0 * ms, k.row - k.height / 2, f" {k.words}", color=red, fontsize=7.5, ha="left", va="bottom")
    top = ax.get_xaxis_transform()       # x in data, y in the axes' height (1: its top)
    for c in s.sections:                 # the run's parts, named above the ranks: a bracket and its words
        x0, x1 = c.t0 * ms, max(c.t1, c.t0 + 0.002 * t_max) * ms
        ax.plot([x0, x0, x1, x1], [1.0, 1.025, 1.025, 1.0], transform=top, color="#777", lw=0.8, clip_on=False)
        words = c.words if c.t1 - c.t0 > 0.0062 * len(c.words) * t_max else c.words.rsplit(" ", 1)[-1]
        ax.text((x0 + x1) / 2, 1.03, words, transform=top, ha="center", va="bottom", fontsize=7, color="#444")
    for t in s.tallies:
        ax.text(1.005, t.row, t.text(), transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_yticks([r.row for r in s.rows], [r.text + (f"\n{r.note}" if r.note else "") for r in s.rows])
    for r in s.rows:                     # a lane's thin row, named at its left
        if r.lane:
            ax.text(-0.005, r.row + sc.LANE_STEP, r.lane, transform=ax.get_yaxis_transform(), ha="right",
                    va="center", fontsize=7, color="#666")
    ax.set_ylim(s.p - 0.5, -0.5)     # rank 0 on top
    ax.set_xlim(0, t_max * ms * 1.01)
    ax.set_title(s.title, fontsize=9.5, loc="left", color=s.title_colour, pad=16 if s.sections else 6)
    ax.grid(axis="x", color="#e4e4e4", lw=0.6)
    ax.set_axisbelow(True)


def handles(items: list[sc.LegendItem]) -> list:
    """The legend's items (scene.legend) as matplotlib handles."""
    out = []
    for i in items:
        if i.swatch == "arrow":
            out.append(Line2D([], [], color=i.colour, marker=">", markersize=5, lw=1, label=i.label))
        elif i.swatch == "idle":
            out.append(Patch(facecolor=i.colour, hatch="///", edgecolor="#c8c8c8", label=i.label))
        elif i.swatch == "wait":
            out.append(Patch(facecolor=i.colour, alpha=0.3, edgecolor=i.colour, linestyle="--", label=i.label))
        else:
            out.append(Patch(color=i.colour, label=i.label))
    return out


def legend_handles(collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
                   pipeline: bool = True, messages: bool = False) -> list:
    """What the colours mean (scene.legend, the widget's words); `pipeline=False` for a run of collectives
    alone (no boxes, messages or bubble), `messages` for a run of messages alone (q19's ring: no boxes or
    bubble)."""
    return handles(sc.legend(collectives, chunks, unfinished, pipeline, messages))


def figure(timelines: list[Timeline], title: str = "", memory_unit: str = "bytes") -> TimelineFigure:
    """One panel per timeline (measured, ideal, ...), each on its own time axis in ms; under a timeline
    whose events carry activation memory, its memory lane (views/memory.py) on the same axis."""
    from lab_src.views.memory import draw_lane, draw_state_lane, has_memory, has_state
    p = timelines[0].p
    panels = [(kind, tl) for tl in timelines for kind in ("timeline", "memory")
              if kind == "timeline" or has_memory(tl) or has_state(tl)]
    heights = [0.45 * p + 1.0 if kind == "timeline" else 0.35 * p + 0.8 if has_state(tl) else 1.3
               for kind, tl in panels]
    fig = TimelineFigure(figsize=(11, 0.5 + sum(heights)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    for ax, (kind, tl) in zip(axes, panels):   # each on its own axis: an ideal step can be much shorter
        if kind == "timeline":
            draw(ax, tl)
        elif has_state(tl):
            draw_state_lane(ax, tl)
        else:
            draw_lane(ax, tl, unit=memory_unit)
    # a run of messages alone (q19's ring) is no training step: its axis counts from the run's start
    axes[-1].set_xlabel(f"time since the {'run' if timelines[0].compute_free else 'step'} started (ms)")
    if title:
        fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    items = handles(sc.legend_of(timelines))
    # one row while it fits the figure's width, else two (an interleaved run's chunk entries are long)
    fig.legend(handles=items, loc="outside lower center", ncol=len(items) if len(items) <= 7 else
               -(-len(items) // 2), fontsize=8, frameon=False)
    return fig
