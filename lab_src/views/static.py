"""The timeline as a matplotlib figure, for when there is no live kernel (autograding, feedback, docs).

One row per rank on a time axis in milliseconds: forward and backward boxes labelled with their
micro-batch, thin bars for sends and receives, an arrow from each send to its receive, and hatched
idle time (the bubble). The title of each panel gives the bubble next to (p-1)/(m+p-1).
"""
from __future__ import annotations

import io

from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from lab_src.views.prepare import (COLLECTIVE_LABELS, COLORS, BOX_LABELS, LANE_BAR, LANE_STEP, Timeline, box_color,
                                   box_label, collective_calls, legend_kinds, row_of, wait_label)

ROW = 0.7     # height of a compute box, in rows
BAR = 0.22    # height of a send/receive bar


class TimelineFigure(Figure):
    """A matplotlib Figure that shows itself as a PNG in a notebook even without pyplot."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", dpi=100)
        return buf.getvalue()


def draw(ax, tl: Timeline, t_max: float | None = None) -> None:
    """Draw one timeline on `ax`; the axis ends at `t_max` seconds (default: the end of the step, and
    for a run that did not finish a little more, for where its ranks were left waiting)."""
    ms = 1e3
    t_max = t_max or tl.drawn_until or 1e-3
    for r in range(tl.p) if not (tl.collectives_only or tl.compute_free) else ():   # the step is hatched idle; what
        # the rank did is drawn over it (a run of collectives alone: between them the rank computes)
        ax.barh(r, tl.span * ms, left=0, height=ROW, color=COLORS["idle"], hatch="///", edgecolor="#d4d4d4", lw=0)
    for e in tl.events:
        if e in tl.folded:
            continue
        if e.is_compute:
            ax.barh(e.rank, e.duration * ms, left=e.t_start * ms, height=ROW, color=box_color(e, tl.chunks),
                    edgecolor="white", lw=0.5)
            if e.duration > max(0.016, 0.0065 * len(box_label(e, tl.chunks))) * t_max:   # only a label that fits
                ax.text((e.t_start + e.duration / 2) * ms, e.rank, box_label(e, tl.chunks),
                        ha="center", va="center", color="white", fontsize=7.5, fontweight="bold")
        elif e.is_collective:       # an all-reduce: a thicker bar, joined to the other members below
            ax.barh(row_of(e), max(e.duration, 0.002 * t_max) * ms, left=e.t_start * ms,
                    height=2 * BAR * (LANE_BAR if e.lane else 1), color=COLORS[e.kind])
        else:
            ax.barh(row_of(e), max(e.duration, 0.002 * t_max) * ms, left=e.t_start * ms,
                    height=BAR * (LANE_BAR if e.lane else 1), color=COLORS["send" if e.is_send else "recv"])
    for kind, group, members in collective_calls(tl.events):
        if len(group) > 1:
            t = max(e.t_end for e in members) * ms
            ax.plot([t, t], [min(group), max(group)], color=COLORS[kind], lw=1.2, ls=":", alpha=0.9)
    for send, recv in tl.matching.pairs:
        if send in tl.folded or recv in tl.folded:
            continue
        down = recv.rank > send.rank
        color = COLORS[send.phase]
        ax.annotate("", xy=(recv.t_end * ms, row_of(recv) + (-BAR if down else BAR) / 2),
                    xytext=(send.t_start * ms, row_of(send) + (BAR if down else -BAR) / 2),
                    arrowprops=dict(arrowstyle="-|>", color=color, lw=0.9, alpha=0.8, shrinkA=0, shrinkB=0,
                                    mutation_scale=8))
    _draw_unfinished(ax, tl, t_max)
    for e, words in tl.marked:           # what the run points out: outlined, and said above it
        ax.barh(row_of(e), max(e.duration, 0.002 * t_max) * ms, left=e.t_start * ms, height=2.4 * BAR, fill=False,
                edgecolor=COLORS["wait"], lw=1.6)
        ax.text(e.t_start * ms, row_of(e) - 1.3 * BAR, f" {words}", color=COLORS["wait"], fontsize=7.5, ha="left",
                va="bottom")
    # a collective whose messages were recorded (q22's, on the student's ring) is in the bytes sent already
    folding = {e.rank for e in tl.folded}
    reduced = {r: sum(e.bytes for e in tl.events if e.rank == r and e.is_collective) if r not in folding else 0
               for r in range(tl.p)}
    sent = tl.bytes_sent()
    how = ("all-reduced" if all(e.kind.startswith("allreduce") for e in tl.events if e.is_collective)
           else "in collectives")     # q22's gathers and reduce-scatters
    for r, n in sent.items() if any(sent.values()) or any(reduced.values()) else ():   # a model's step: no bytes
        extra = f"\n+ {reduced[r]:,} B {how}" if reduced[r] else ""
        text = f"{reduced[r]:,} B {how}" if tl.collectives_only else f"sent {n:,} B{extra}"
        ax.text(1.005, r, text, transform=ax.get_yaxis_transform(), va="center", fontsize=8)
    ax.set_yticks(range(tl.p), [f"rank {r}" for r in range(tl.p)])
    # a lane's thin row, named at its left
    for r, label in tl.lanes.items():
        ax.text(-0.005, r + LANE_STEP, label, transform=ax.get_yaxis_transform(), ha="right", va="center",
                fontsize=7, color="#666")
    ax.set_ylim(tl.p - 0.5, -0.5)     # rank 0 on top
    ax.set_xlim(0, t_max * ms * 1.01)
    title = f"{tl.kind}: step {tl.span * ms:.1f} ms · {tl.bubble_text()}"
    if tl.unfinished:
        title = f"{tl.kind}: this run did not finish" + (f": {tl.verdict}" if tl.verdict else "")
    ax.set_title(title + (f"\n{tl.kind}: {tl.note}" if tl.note else ""), fontsize=9.5, loc="left",
                 color=COLORS["wait"] if tl.unfinished else "black")
    ax.grid(axis="x", color="#e4e4e4", lw=0.6)
    ax.set_axisbelow(True)


def _draw_unfinished(ax, tl: Timeline, t_max: float) -> None:
    """Where a run that did not finish left its ranks (see svg.py's `_unfinished`)."""
    ms, red = 1e3, COLORS["wait"]
    for w in tl.waits:
        end = min(w.t_end, t_max)
        ax.barh(w.rank, (end - w.t_start) * ms, left=w.t_start * ms, height=ROW * 0.8, color=red, alpha=0.13,
                edgecolor=red, lw=1.2, linestyle="--")
        label = wait_label(w, tl.chunks)
        until = f"until stopped at {w.t_end * ms:.0f} ms »" if w.t_end > t_max else ""
        if (t_max - w.t_start) > 0.007 * t_max * (len(label) + len(until) + 4):    # room for both in the bar
            ax.text((w.t_start + 0.004 * t_max) * ms, w.rank, label, va="center", ha="left", color=red,
                    fontsize=7.5, clip_on=True)
            if until:
                ax.text(t_max * ms, w.rank, until, va="center", ha="right", color=red, fontsize=7, clip_on=True)
        else:                                  # a wait that began late: one line, ending at the edge
            ax.text(t_max * ms, w.rank, " · ".join(filter(None, [label, until])), va="center", ha="right",
                    color=red, fontsize=7, clip_on=True,
                    bbox=dict(facecolor="white", edgecolor="none", alpha=0.85, pad=1))
    for send in tl.matching.lost_sends:
        down = send.peer > send.rank
        x0 = send.t_start * ms
        x1 = min(send.t_start + 0.04 * t_max, t_max * 0.99) * ms
        y1 = send.peer - (ROW / 2 if down else -ROW / 2)
        ax.plot([x0, x1], [send.rank, y1], color=red, lw=1, linestyle="--")
        ax.text(x1, y1, "✕", color=red, fontsize=9, ha="center", va="center")
    for rank, t, what in tl.ends:
        x = min(t, t_max) * ms
        ax.text(x, rank, "✕", color=red, fontsize=12, fontweight="bold", ha="center", va="center")
        ax.text(x, rank - ROW / 2, f" {what}", color=red, fontsize=7.5, ha="left", va="bottom")


def legend_handles(collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
                   pipeline: bool = True, messages: bool = False) -> list:
    """What the colours mean; `pipeline=False` for a run of collectives alone (no boxes, messages or bubble),
    `messages` for a run of messages alone (q19's ring: no boxes or bubble)."""
    extra = [Patch(facecolor=COLORS["wait"], alpha=0.3, edgecolor=COLORS["wait"], linestyle="--",
                   label="left waiting")] if unfinished else []
    if messages:
        return extra + [Patch(color=COLORS["send"], label="send"), Patch(color=COLORS["recv"], label="receive (waiting)"),
                        Line2D([], [], color="#555", marker=">", markersize=5, lw=1, label="message: send → receive")]
    if not pipeline:
        return extra + [Patch(color=COLORS[k], label=COLLECTIVE_LABELS[k]) for k in COLLECTIVE_LABELS
                        if k in collectives]
    later = []
    if chunks > 1:     # the palest forward and backward: the last chunk
        from lab_src.pipeline.trace import Event
        pale = [Event(0, k, 0, None, None, 0, 0.0, 0.0, chunks - 1) for k in ("forward", "backward")]
        later = [Patch(color=box_color(pale[0], chunks), label=f"paler: later chunks (F3c1: micro-batch 3, chunk 1)"),
                 Patch(color=box_color(pale[1], chunks), label=f"backward, chunk {chunks - 1}")]
    return extra + [Patch(color=COLORS["forward"], label="forward"), Patch(color=COLORS["backward"], label="backward"),
                    *later,
                    Patch(color=COLORS["send"], label="send"), Patch(color=COLORS["recv"], label="receive (waiting)"),
                    Patch(facecolor=COLORS["idle"], hatch="///", edgecolor="#c8c8c8", label="idle (bubble)"),
                    Line2D([], [], color="#555", marker=">", markersize=5, lw=1, label="message: send → receive")] + \
        [Patch(color=COLORS[k], label=COLLECTIVE_LABELS[k]) for k in COLLECTIVE_LABELS if k in collectives] + \
        [Patch(color=COLORS[k], label=BOX_LABELS[k]) for k in BOX_LABELS if k in collectives]


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
    axes[-1].set_xlabel("time since the step started (ms)")
    if title:
        fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    unfinished = any(tl.unfinished for tl in timelines)
    kinds = legend_kinds(e for tl in timelines for e in tl.events)
    handles = legend_handles(kinds, timelines[0].chunks, unfinished, messages=bool(timelines[0].compute_free))
    # one row while it fits the figure's width, else two (an interleaved run's chunk entries are long)
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles) if len(handles) <= 7 else
               -(-len(handles) // 2), fontsize=8, frameon=False)
    return fig
