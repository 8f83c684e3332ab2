"""One frame of the animated timeline, as inline SVG (the widget redraws it at every step).

The frame at step i shows the run up to the moment its i-th event finished (the red cursor): what
happened before is drawn in colour, idle time hatched; what is still to come is a faint ghost, so
the layout never jumps. The event that just finished is outlined, and if it is a message, its arrow
from send to receive is drawn bold. Hovering any box shows what it was.
"""
from __future__ import annotations

import math
from html import escape

from lab_src.views import memory
from lab_src.views.prepare import (COLLECTIVE_LABELS, COLORS, BOX_LABELS, LANE_BAR, LANE_STEP, Timeline, box_color,
                                   box_label, collective_calls, describe, describe_wait, legend_kinds,
                                   row_of, wait_label)

LEFT, RIGHT, TOP, ROW_H, BOX_H, BAR_H, AXIS_H, LEGEND_H = 62, 118, 10, 46, 28, 10, 36, 22
GHOST = 0.16

DEFS = f"""<defs>
<pattern id="pp-idle" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">
<rect width="6" height="6" fill="{COLORS['idle']}"/>
<line x1="0" y1="0" x2="0" y2="6" stroke="#d0d0d0" stroke-width="2"/>
</pattern>
<marker id="pp-head-forward" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto">
<path d="M0,0 L10,5 L0,10 z" fill="{COLORS['forward']}"/></marker>
<marker id="pp-head-backward" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto">
<path d="M0,0 L10,5 L0,10 z" fill="{COLORS['backward']}"/></marker>
</defs>"""


def nice_ticks(t_max_ms: float, target: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from 0 to t_max_ms."""
    raw = max(t_max_ms, 1e-6) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(k * power for k in (1, 2, 5, 10) if k * power >= raw)
    return [i * step for i in range(int(t_max_ms / step) + 1)]


def legend(x: float, y: float, collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
           right: float | None = None, pipeline: bool = True, messages: bool = False) -> str:
    """What the colours mean, in one line starting at (x, y); past `right`, the rest goes on a second line
    LEGEND_LINE below (`legend_lines` says whether it will)."""
    start = x
    parts = []
    for kind, fill, label, h in _legend_items(collectives, chunks, unfinished, pipeline, messages):
        w = _legend_width(label, kind)
        if right is not None and x > start and x + w > right:
            x, y = start, y + LEGEND_LINE
        if kind == "wait":
            parts.append(f'<rect x="{x:.0f}" y="{y - 10:.1f}" width="14" height="10" fill="{COLORS["wait"]}" '
                         f'fill-opacity="0.18" stroke="{COLORS["wait"]}" stroke-dasharray="3,2"/>'
                         f'<text x="{x + 18:.0f}" y="{y}" fill="#444">{label}</text>')
        elif kind == "arrow":
            parts.append(f'<line x1="{x:.0f}" y1="{y - 4}" x2="{x + 22:.0f}" y2="{y - 4}" stroke="#777" '
                         f'stroke-width="1.2" marker-end="url(#pp-head-forward)"/><text x="{x + 28:.0f}" y="{y}" '
                         f'fill="#444">{label}</text>')
        else:
            size = 12 if h == BOX_H else 5
            parts.append(f'<rect x="{x:.0f}" y="{y - 4 - size / 2:.1f}" width="14" height="{size}" fill="{fill}"/>'
                         f'<text x="{x + 18:.0f}" y="{y}" fill="#444">{label}</text>')
        x += w
    return "".join(parts)


LEGEND_LINE = 16


def legend_lines(x: float, right: float, collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
                 pipeline: bool = True, messages: bool = False) -> int:
    """How many lines the legend takes between x and right (1 or 2)."""
    width = sum(_legend_width(label, kind)
                for kind, _, label, _ in _legend_items(collectives, chunks, unfinished, pipeline, messages))
    return 1 if x + width <= right else 2


def _legend_width(label: str, kind: str) -> float:
    return (28 if kind == "arrow" else 18) + 6.2 * len(label) + 12


def _legend_items(collectives: tuple, chunks: int, unfinished: bool, pipeline: bool = True,
                  messages: bool = False) -> list[tuple]:
    wait = [("wait", None, "left waiting", BOX_H)] if unfinished else []
    if messages:            # a run of messages alone (q19's ring): no boxes or bubble to name
        return wait + [("box", COLORS["send"], "send", BAR_H), ("box", COLORS["recv"], "receive (waiting)", BAR_H),
                       ("arrow", None, "message: send → receive", BAR_H)]
    if not pipeline:        # a run of collectives alone: no boxes, messages or bubble to name
        return wait + [("box", COLORS[k], COLLECTIVE_LABELS[k], BAR_H) for k in COLLECTIVE_LABELS if k in collectives]
    forward = "forward (paler: later chunks)" if chunks > 1 else "forward"
    items = [("box", COLORS["forward"], forward, BOX_H), ("box", COLORS["backward"], "backward", BOX_H),
             ("box", COLORS["send"], "send", BAR_H), ("box", COLORS["recv"], "receive (waiting)", BAR_H),
             ("box", "url(#pp-idle)", "idle (bubble)", BOX_H)]
    items += [("box", COLORS[k], COLLECTIVE_LABELS[k].replace("-embedding", ""), BAR_H) for k in COLLECTIVE_LABELS
              if k in collectives]
    items[2:2] = [("box", COLORS[k], BOX_LABELS[k], BOX_H) for k in BOX_LABELS if k in collectives]
    if unfinished:
        items = [("wait", None, "left waiting", BOX_H)] + [i for i in items if i[2] != "idle (bubble)"]
    return items + [("arrow", None, "message: send → receive", BAR_H)]


def frame(tl: Timeline, step: int | None = None, t_max: float | None = None, width: int = 860) -> str:
    """The SVG of `tl` at `step` (an index into tl.events; None: the whole run, no cursor)."""
    t_max = t_max or tl.drawn_until or 1e-3
    plot_w = width - LEFT - RIGHT
    lane_h = memory.lane_height(tl)      # the memory lane, when the run counted it
    collectives = legend_kinds(tl.events)
    extra = (legend_lines(LEFT, width - 8, collectives, tl.chunks, tl.unfinished, not tl.collectives_only,
                          bool(tl.compute_free)) - 1) \
        * LEGEND_LINE
    height = TOP + tl.p * ROW_H + lane_h + AXIS_H + LEGEND_H + extra
    current = tl.events[step] if step is not None and tl.events else None
    cursor = current.t_end if current is not None else float("inf")
    current_pair = tl.arrow_of(current) if current is not None and not current.is_compute else None

    def x(t: float) -> float:
        return LEFT + min(t, t_max) / t_max * plot_w

    def mid(r: int) -> float:
        return TOP + r * ROW_H + ROW_H / 2

    def ymid(e) -> float:        # an event's row: its rank's, or a lane's thin row under it
        return TOP + row_of(e) * ROW_H + ROW_H / 2

    out = [f'<svg class="pp-timeline-frame" data-step="{-1 if step is None else step}" '
           f'data-view="{tl.kind}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'style="width:100%; max-width:{width}px; height:auto" font-family="sans-serif" font-size="11">', DEFS]
    # rows: label, and idle (hatched) from the start of the step to the cursor
    lanes = tl.lanes
    for r in range(tl.p):
        out.append(f'<text x="{LEFT - 8}" y="{mid(r) + 4}" text-anchor="end">rank {r}</text>')
        if r in lanes:     # a lane's thin row, named at its left
            out.append(f'<text x="{LEFT - 8}" y="{mid(r) + LANE_STEP * ROW_H + 3:.1f}" text-anchor="end" '
                       f'font-size="9" fill="#666">{lanes[r]}</text>')
        if tl.row_notes:     # the rank's coordinates on a grid: "dp 1, pp 1" (above the label where a lane is under it)
            out.append(f'<text x="{LEFT - 8}" y="{mid(r) + (-10 if r in lanes else 16)}" text-anchor="end" '
                       f'font-size="9" fill="#666">'
                       f'{tl.row_notes[r]}</text>')
        if not (tl.collectives_only or tl.compute_free):   # between collectives (or a ring's messages) it computes
            out.append(f'<rect x="{x(0):.1f}" y="{mid(r) - BOX_H / 2}" width="{x(min(cursor, tl.span)) - x(0):.1f}" '
                       f'height="{BOX_H}" fill="url(#pp-idle)"/>')
    # boxes: done in colour, the part still to come as a ghost
    for e in tl.events:
        if e in tl.folded:
            continue
        compute = e.is_compute
        color = box_color(e, tl.chunks) if compute else COLORS[e.kind] if e.is_collective else \
            COLORS["send" if e.is_send else "recv"]
        h = (BOX_H if compute else 1.8 * BAR_H if e.is_collective else BAR_H) * (LANE_BAR if e.lane else 1)
        y = ymid(e) - h / 2
        x0, x1 = x(e.t_start), max(x(e.t_end), x(e.t_start) + 1.5)
        xc = min(max(x(cursor), x0), x1) if cursor < e.t_end else x1
        tip = f"<title>{escape(describe(e, tl.arrow_of(e), tl.chunks))}</title>"
        edge = ' stroke="white" stroke-width="0.8"' if compute else ""    # keeps neighbouring boxes apart
        if xc < x1:
            out.append(f'<rect x="{xc:.1f}" y="{y:.1f}" width="{x1 - xc:.1f}" height="{h}" fill="{color}" '
                       f'opacity="{GHOST}"{edge}>{tip}</rect>')
        if xc > x0:
            out.append(f'<rect x="{x0:.1f}" y="{y:.1f}" width="{xc - x0:.1f}" height="{h}" fill="{color}"{edge}>'
                       f'{tip}</rect>')
        if e is current:
            out.append(f'<rect x="{x0 - 1:.1f}" y="{y - 1:.1f}" width="{x1 - x0 + 2:.1f}" height="{h + 2}" '
                       f'fill="none" stroke="#111" stroke-width="2"/>')
        if compute and x1 - x0 > max(14, 6.5 * len(box_label(e, tl.chunks)) + 2):   # only a label that fits
            fill = "white" if cursor >= e.t_end else "#888"
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{mid(e.rank) + 4}" text-anchor="middle" fill="{fill}" '
                       f'font-size="10" font-weight="bold" pointer-events="none">'
                       f'{box_label(e, tl.chunks)}</text>')
    # arrows, from the start of each send to the end of its receive
    for send, recv in tl.matching.pairs:
        if send in tl.folded or recv in tl.folded:
            continue
        down = recv.rank > send.rank
        y0 = ymid(send) + (BAR_H / 2 if down else -BAR_H / 2)
        y1 = ymid(recv) - (BAR_H / 2 if down else -BAR_H / 2)
        phase = send.phase
        bold = (send, recv) == current_pair
        opacity = 1 if bold else (0.85 if recv.t_end <= cursor else GHOST)
        out.append(f'<line x1="{x(send.t_start):.1f}" y1="{y0:.1f}" x2="{x(recv.t_end):.1f}" y2="{y1:.1f}" '
                   f'stroke="{COLORS[phase]}" stroke-width="{3 if bold else 1.2}" opacity="{opacity}" '
                   f'marker-end="url(#pp-head-{phase})"/>')
    # each all-reduce joins its members once the last of them is done
    for kind, group, members in collective_calls(tl.events):
        done = max(e.t_end for e in members)
        if len(group) > 1 and done <= cursor:
            out.append(f'<line x1="{x(done):.1f}" y1="{mid(min(group)):.1f}" x2="{x(done):.1f}" '
                       f'y2="{mid(max(group)):.1f}" stroke="{COLORS[kind]}" stroke-width="1.5" '
                       f'stroke-dasharray="3,2"/>')
    out += _unfinished(tl, x, mid, cursor, t_max)
    for e, words in tl.marked:           # what the run points out: outlined, and said above it
        x0, x1 = x(e.t_start), max(x(e.t_end), x(e.t_start) + 1.5)
        out.append(f'<rect x="{x0 - 2:.1f}" y="{ymid(e) - BAR_H:.1f}" width="{x1 - x0 + 4:.1f}" '
                   f'height="{2 * BAR_H}" fill="none" stroke="{COLORS["wait"]}" stroke-width="1.6"/>'
                   f'<text x="{x0:.1f}" y="{ymid(e) - BAR_H - 3:.1f}" fill="{COLORS["wait"]}" font-size="10">'
                   f'{escape(words)}</text>')
    # bytes each rank has sent so far
    for r in range(tl.p) if any(e.bytes for e in tl.events if e.is_send) else ():   # a model's step: no bytes
        sent = sum(e.bytes for e in tl.events if e.rank == r and e.is_send and e.t_end <= cursor)
        out.append(f'<text x="{width - RIGHT + 8}" y="{mid(r) + 4}" fill="#444">sent {sent:,} B</text>')
    if memory.has_state(tl):
        out.append(memory.svg_state_lane(tl, x, TOP + tl.p * ROW_H, LEFT, plot_w, cursor))
    elif lane_h:
        out.append(memory.svg_lane(tl, x, TOP + tl.p * ROW_H, LEFT, plot_w, cursor))
    # time axis in ms, and the cursor
    axis_y = TOP + tl.p * ROW_H + lane_h + 4
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{LEFT + plot_w}" y2="{axis_y}" stroke="#888"/>')
    for t in nice_ticks(t_max * 1e3):
        xt = x(t / 1e3)
        out.append(f'<line x1="{xt:.1f}" y1="{axis_y}" x2="{xt:.1f}" y2="{axis_y + 4}" stroke="#888"/>'
                   f'<text x="{xt:.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#444">{t:g}</text>')
    out.append(f'<text x="{LEFT - 8}" y="{axis_y + 16}" text-anchor="end" fill="#444">time (ms)</text>')
    if current is not None:
        xc = x(cursor)
        out.append(f'<line x1="{xc:.1f}" y1="{TOP - 4}" x2="{xc:.1f}" y2="{axis_y}" stroke="{COLORS["cursor"]}" '
                   f'stroke-width="1.5"/><text x="{xc + 3:.1f}" y="{axis_y + 30}" fill="{COLORS["cursor"]}">'
                   f't = {cursor * 1e3:.2f} ms</text>')
    out.append(legend(LEFT, height - 8 - extra, collectives, tl.chunks, tl.unfinished, right=width - 8,
                      pipeline=not tl.collectives_only, messages=bool(tl.compute_free)))
    out.append("</svg>")
    return "\n".join(out)


def _unfinished(tl: Timeline, x, mid, cursor: float, t_max: float) -> list[str]:
    """What a run that did not finish left: each rank's last wait (red, dashed, to where the run was
    stopped or to the edge), sends that no receive took (a dashed arrow ending in a cross), and where
    a rank's part ended in an exception (a cross)."""
    out, red = [], COLORS["wait"]
    for w in tl.waits:
        if w.t_start > cursor:
            continue
        x0, x1 = x(w.t_start), x(min(w.t_end, t_max))
        y = mid(w.rank) - BOX_H / 2 + 2
        cut = w.t_end > t_max
        out.append(f'<rect class="pp-wait" x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0, 3):.1f}" height="{BOX_H - 4}" '
                   f'fill="{red}" fill-opacity="0.13" stroke="{red}" stroke-width="1.4" stroke-dasharray="4,2">'
                   f'<title>{escape(describe_wait(w))}</title></rect>')
        label = escape(wait_label(w, tl.chunks))
        edge = x(t_max)
        fits = x0 + 4 + 5.6 * len(label) < edge
        out.append(f'<text x="{x0 + 4 if fits else edge - 2:.1f}" y="{mid(w.rank) - BOX_H / 2 - 3:.1f}" '
                   f'fill="{red}" font-size="10" text-anchor="{"start" if fits else "end"}" '
                   f'pointer-events="none">{label}</text>')
        if cut:
            out.append(f'<text x="{x1 - 3:.1f}" y="{mid(w.rank) + 4}" fill="{red}" font-size="9" '
                       f'text-anchor="end">until stopped at {w.t_end * 1e3:.0f} ms »</text>')
    for send in tl.matching.lost_sends:
        if send.t_start > cursor:
            continue
        down = send.peer > send.rank
        y0, y1 = mid(send.rank) + (BAR_H / 2 if down else -BAR_H / 2), mid(send.peer) - (BAR_H if down else -BAR_H)
        x0 = x(send.t_start)
        x1 = min(x0 + 40, x(t_max) - 8)
        out.append(f'<line class="pp-lost" x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y1:.1f}" stroke="{red}" '
                   f'stroke-width="1.2" stroke-dasharray="3,2"><title>{escape(describe(send, None))}: no receive '
                   f'took it</title></line><text x="{x1:.1f}" y="{y1 + 4:.1f}" fill="{red}" font-size="12" '
                   f'text-anchor="middle">✕</text>')
    for rank, t, what in tl.ends:
        if t > cursor:
            continue
        out.append(f'<text class="pp-end" x="{x(min(t, t_max)):.1f}" y="{mid(rank) + 5}" fill="{red}" font-size="15" '
                   f'font-weight="bold" text-anchor="middle">✕<title>rank {rank} {escape(what)} here</title></text>'
                   f'<text x="{x(min(t, t_max)) + 9:.1f}" y="{mid(rank) - BOX_H / 2 + 2}" fill="{red}" '
                   f'font-size="10">{escape(what)}</text>')
    return out
