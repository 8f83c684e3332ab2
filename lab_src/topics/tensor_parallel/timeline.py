"""Q17's and q18's runs on a time axis: every tensor-parallel rank's collectives, drawn as q14's all-reduces are
(bars joined across their group, views/static.py), one row per rank, each call labelled with its part and
direction.

The events are what the ranks recorded (comm/collectives.py: the answer's own torch.distributed calls); the
parts of the case ran one after another (copy, reduce, column, row, mlp; topics/tensor_parallel/kind_layers.py), so the
bars come in that order, each part's forward before its backward. Each part's record keeps which of the rank's
events its forward and its backward made (`fwd_span`, `bwd_span`): `call_labels` reads them.

Between two bars a rank computes (nothing else is recorded), so nothing there is drawn as idle. Ranks start
at different times (each builds its layers, the first reaches the first all-reduce and waits for the last):
`without_start_up` cuts that wait off the first call, so that the axis shows the calls, and says how long it was.
"""
from __future__ import annotations

from dataclasses import replace

from lab_src.pipeline.trace import Event

PHASES = (("fwd", "forward"), ("bwd", "backward"))


def call_labels(outcome, key: str, parts) -> dict[tuple[int, int], str]:
    """{(rank, k): "column, backward"}: the part and direction of the k-th event rank made in a case, from each
    part's record (`outcome.obs[rank][key][part]`'s spans); an event outside them (q18's evaluation-mode
    forward) gets its part alone."""
    labels = {}
    for r, obs in outcome.obs.items():
        for part in parts:
            rec = (obs.get(key) or {}).get(part) or {}
            spans = [(rec.get(f"{ph}_span"), word) for ph, word in PHASES]
            for (span, word) in spans:
                if span:
                    labels.update({(r, k): f"{part}, {word}" for k in range(*span)})
            done = [sp for sp, _ in spans if sp]
            if len(done) == 2:              # between the forward and the backward: neither (q18's eval pass)
                labels.update({(r, k): f"{part}, eval" for k in range(done[0][1], done[1][0])})
    return labels


def labelled(events: list[Event], labels: dict) -> dict[Event, str]:
    """{event: its label}, numbering each rank's events in the order it made them."""
    out = {}
    for r in sorted({e.rank for e in events}):
        for k, e in enumerate(sorted((e for e in events if e.rank == r), key=lambda e: e.t_start)):
            if (r, k) in labels:
                out[e] = labels[(r, k)]
    return out


def without_start_up(events: list[Event], names: dict | None = None) -> tuple[list[Event], dict, float]:
    """(events, names, wait): the first call of every rank starts when the last rank reached it, the times
    shifted so that this is 0; `wait` is how long the first rank had waited there (s)."""
    firsts = {}
    for e in sorted(events, key=lambda e: e.t_start):
        firsts.setdefault(e.rank, e)
    if len(firsts) < 2:
        return events, dict(names or {}), 0.0
    t0 = max(e.t_start for e in firsts.values())
    wait = t0 - min(e.t_start for e in firsts.values())
    moved, new_names = [], {}
    for e in events:
        f = replace(e, t_start=max(e.t_start, min(t0, e.t_end)) - t0, t_end=e.t_end - t0)
        moved.append(f)
        if names and e in names:
            new_names[f] = names[e]
    return moved, new_names, wait


def cut_gaps(events: list[Event], names: dict) -> tuple[list[Event], dict, list[tuple[float, float]]]:
    """(events, names, cuts): every stretch in which no rank was in a call and that lasts more than 4 times the
    median call (a part setting up its layers between two parts: q18's dropout part began 3.6 s after the
    block's last call) shortened to one median call, so that the calls are not squeezed into the edges of the
    axis; `cuts`: (where on the new axis, seconds cut)."""
    if len(events) < 2:
        return events, names, []
    import statistics
    keep = statistics.median(e.duration for e in events) or 1e-3
    order = sorted(events, key=lambda e: e.t_start)
    shifts, cuts, covered, shift = [], [], order[0].t_end, 0.0
    for e in order:
        gap = e.t_start - covered
        if gap > 4 * keep:
            shift += gap - keep
            cuts.append((covered - (shift - (gap - keep)) + keep / 2, gap - keep))
        shifts.append(shift)
        covered = max(covered, e.t_end)
    moved = {e: replace(e, t_start=e.t_start - sh, t_end=e.t_end - sh) for e, sh in zip(order, shifts)}
    return ([moved[e] for e in events], {moved[e]: n for e, n in names.items() if e in moved}, cuts)


def cuts_text(cuts) -> str:
    return (f"{len(cuts)} stretch{'es' if len(cuts) != 1 else ''} in which no rank was in a collective (setting up "
            f"the next part) cut short: {', '.join(f'{c * 1e3:.0f} ms' for _, c in cuts)}" if cuts else "")


def start_up_text(wait: float) -> str:
    return (f"start-up cut off: the first rank reached the first all-reduce {wait * 1e3:.0f} ms before the last "
            f"(building its layers); the axis starts when all had" if wait > 1e-3 else "")


def tp_timeline_figure(events: list[Event], t: int, title: str = "", parts=(), labels: dict | None = None):
    """The static figure of one q17 or q18 case on `t` ranks; `labels`: `call_labels` of the case."""
    from lab_src.views.prepare import collective_calls, prepare
    from lab_src.views.scene import legend_of
    from lab_src.views.static import TimelineFigure, draw, handles
    names = labelled(events, labels or {})
    events, names, wait = without_start_up(events, names)
    events, names, cuts = cut_gaps(events, names)
    tl = prepare(events, t, 1, align=False)
    fig = TimelineFigure(figsize=(11, 1.9 + 0.5 * t), layout="constrained")
    ax = fig.subplots()
    draw(ax, tl)
    for i, (_, group, members) in enumerate(collective_calls(tl.events)):   # each call's part, over its bars
        name = next((names[e] for e in members if e in names), None)
        if name:
            ax.text((max(e.t_start for e in members) + max(e.t_end for e in members)) / 2 * 1e3,
                    min(group) - 0.32 - 0.18 * (i % 2), name, ha="center", va="bottom", fontsize=7, color="#333")
    for at, cut in cuts:        # where a stretch without calls was shortened
        ax.axvline(at * 1e3, color="#999", lw=1.0, ls=(0, (2, 2)))
        ax.text(at * 1e3, t - 0.45, f" {cut * 1e3:.0f} ms cut", fontsize=7, color="#666", va="bottom")
    ax.set_ylim(t - 0.5, -1.0)
    ax.set_yticks(range(t), [f"rank {r}" for r in range(t)], fontsize=8)
    calls = sum(1 for e in events if e.is_collective and e.rank == 0)
    order = f" · the parts, in order: {', '.join(parts)}" if parts else ""
    ax.set_title(f"{t} ranks · {calls} collective{'s' if calls != 1 else ''} on rank 0{order}"
                 + "".join(f"\n{x}" for x in (start_up_text(wait), cuts_text(cuts)) if x), fontsize=9.5, loc="left")
    ax.set_xlabel("time (ms); between two bars a rank computes")
    if title:
        fig.suptitle(title, fontsize=12, x=0.01, ha="left")
    fig.legend(handles=handles(legend_of([tl])), loc="outside lower center", ncol=4, fontsize=8,
               frameon=False)
    return fig


def show_tp_timeline(events: list[Event], t: int, title: str = "", parts=(), labels: dict | None = None):
    """The animated timeline of one q17 or q18 case (the collectives step by step, as q14's widget steps through
    its all-reduces); the static figure while autograding."""
    import os
    if os.environ.get("NBGRADER_EXECUTION"):
        return tp_timeline_figure(events, t, title, parts, labels)
    from html import escape

    from lab_src.views.prepare import prepare
    from lab_src.views.widget import TimelineWidget
    names = labelled(events, labels or {})
    events, names, wait = without_start_up(events, names)
    events, names, cuts = cut_gaps(events, names)

    class CollectivesWidget(TimelineWidget):
        def _side_panel(self) -> str:
            return collectives_panel(self.view.events, t, parts, names, wait, cuts)

        def redraw(self) -> None:
            super().redraw()
            tl = self.view
            if tl.events:
                e = tl.events[min(self.slider.value, len(tl.events)) - 1]
                if e in names:
                    self.info.value = self.info.value.replace("</div>", f" · {escape(names[e])}</div>", 1)

    return CollectivesWidget(prepare(events, t, 1, align=False), None, title=f"{title} ({t} ranks)")


def collectives_panel(events: list[Event], t: int, parts=(), names: dict | None = None, wait: float = 0.0,
                      cuts=()) -> str:
    """The widget's side panel: per rank, the collectives its code made and the bytes it handed to them; rank
    0's calls in order, each with its part and direction."""
    from html import escape
    rows = "".join(
        f"<tr><td>rank {r}</td><td style='text-align:right'>{sum(1 for e in events if e.rank == r and e.is_collective)}"
        f"</td><td style='text-align:right'>{sum(e.bytes for e in events if e.rank == r and e.is_collective):,} B</td></tr>"
        for r in range(t))
    kinds = sorted({e.kind for e in events if e.is_collective})
    order = f"The parts ran one after another: {', '.join(parts)}; each part's forward before its backward." if parts else ""
    mine = [names[e] for e in sorted(events, key=lambda e: e.t_start) if e.rank == 0 and e in (names or {})]
    calls = ("<b>Rank 0's calls</b><ol style='margin:2px 0 6px 18px; padding:0'>"
             + "".join(f"<li>{escape(n)}</li>" for n in mine) + "</ol>") if mine else ""
    return (f'<div class="pp-timeline-side" style="font-size:12px; line-height:1.45">'
            f"<b>Collectives</b> ({escape(', '.join(kinds)) or 'none'})<table>"
            f"<tr><td></td><td>calls</td><td>bytes handed</td></tr>{rows}</table><br>{calls}"
            f"<div style='color:#555'>{escape(order)} {escape(lesson(parts))} Between two bars a rank computes. "
            f"{escape(start_up_text(wait))} {escape(cuts_text(cuts))}</div></div>")


def lesson(parts=()) -> str:
    """What a right answer's collectives look like, for the parts the case ran (q17's or q18's)."""
    if "block" in parts or "dropout" in parts:
        return ("A correct block makes one all-reduce of the activation after its attention and one after its MLP "
                "in the forward, and one before each in the backward, on every rank.")
    return "A correct MLP makes one all-reduce of the activation in its forward and one in its backward, on every rank."
