"""One frame of the animated timeline, as inline SVG (the widget redraws it at every step).

The frame at step i shows the run up to the moment its i-th event finished (the red cursor): what
happened before is drawn in colour, idle time hatched; what is still to come is a faint ghost, so
the layout never jumps. The event that just finished is outlined, and if it is a message, its arrow
from send to receive is drawn bold. Hovering any box shows what it was.

What the frame shows is decided by views/scene.py (the same scene the static figure paints); this module paints
its primitives as SVG elements, and the memory lane (views/memory.py) under them.
"""
from __future__ import annotations

import functools
import math
from html import escape

from lab_src.views import memory
from lab_src.views import scene as sc
from lab_src.views.prepare import COLORS, LANE_RING, Timeline

LEFT, RIGHT, TOP, ROW_H, AXIS_H, LEGEND_H = 62, 130, 10, 46, 36, 22
SECTION_H = 18      # px above the ranks for the sections' names (scene.Section), where a scene has any
BOX_H, BAR_H = sc.BOX * ROW_H, sc.BAR * ROW_H     # px: a compute box's height, a thin bar's (the legend's swatches)
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
<marker id="pp-head-grey" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto">
<path d="M0,0 L10,5 L0,10 z" fill="{sc.ARROW_GREY}"/></marker>
<marker id="pp-head-{LANE_RING}" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" markerHeight="6" orient="auto">
<path d="M0,0 L10,5 L0,10 z" fill="{COLORS[LANE_RING]}"/></marker>
</defs>"""


def nice_ticks(t_max_ms: float, target: int = 8) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten) from 0 to t_max_ms."""
    raw = max(t_max_ms, 1e-6) / target
    power = 10 ** math.floor(math.log10(raw))
    step = next(k * power for k in (1, 2, 5, 10) if k * power >= raw)
    return [i * step for i in range(int(t_max_ms / step) + 1)]


def legend(x: float, y: float, collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
           right: float | None = None, pipeline: bool = True, messages: bool = False) -> str:
    """What the colours mean (scene.legend), in one line starting at (x, y); past `right`, the rest goes on
    further lines LEGEND_LINE apart (`legend_lines` says how many)."""
    return paint_legend(sc.legend(collectives, chunks, unfinished, pipeline, messages), x, y, right)


LEGEND_LINE = 16


def legend_lines(x: float, right: float, collectives: tuple = (), chunks: int = 1, unfinished: bool = False,
                 pipeline: bool = True, messages: bool = False) -> int:
    """How many lines the legend takes between x and right."""
    return _lines(sc.legend(collectives, chunks, unfinished, pipeline, messages), x, right)


def _legend_width(item: sc.LegendItem) -> float:
    return (28 if item.swatch == "arrow" else 18) + 6.2 * len(item.label) + 12


def _layout(items: list[sc.LegendItem], x: float, right: float | None) -> list[tuple[float, int]]:
    """(x, line) of each item: in a line from x, a new line where the next would pass `right`."""
    out, at, line = [], x, 0
    for item in items:
        w = _legend_width(item)
        if right is not None and at > x and at + w > right:
            at, line = x, line + 1
        out.append((at, line))
        at += w
    return out


def _lines(items: list[sc.LegendItem], x: float, right: float) -> int:
    return 1 + max((line for _, line in _layout(items, x, right)), default=0)


def paint_legend(items: list[sc.LegendItem], x: float, y: float, right: float | None = None) -> str:
    """The legend's items as SVG, from (x, y)."""
    parts = []
    for item, (xi, line) in zip(items, _layout(items, x, right)):
        yi = y + line * LEGEND_LINE
        text = (f'<text x="{xi + (28 if item.swatch == "arrow" else 18):.0f}" y="{yi}" fill="#444">'
                f'{escape(item.label, quote=False)}</text>')
        if item.swatch == "wait":
            parts.append(f'<rect x="{xi:.0f}" y="{yi - 10:.1f}" width="14" height="10" fill="{item.colour}" '
                         f'fill-opacity="0.18" stroke="{item.colour}" stroke-dasharray="3,2"/>' + text)
        elif item.swatch == "arrow":       # the head in the arrow's colour
            head = {COLORS["forward"]: "forward", COLORS["backward"]: "backward"}.get(item.colour, "grey")
            parts.append(f'<line x1="{xi:.0f}" y1="{yi - 4}" x2="{xi + 22:.0f}" y2="{yi - 4}" stroke="{item.colour}" '
                         f'stroke-width="1.2" marker-end="url(#pp-head-{head})"/>' + text)
        else:
            size = 5 if item.swatch == "bar" else 12
            fill = "url(#pp-idle)" if item.swatch == "idle" else item.colour
            parts.append(f'<rect x="{xi:.0f}" y="{yi - 4 - size / 2:.1f}" width="14" height="{size}" fill="{fill}"/>'
                         + text)
    return "".join(parts)


def frame(tl: Timeline, step: int | None = None, t_max: float | None = None, width: int = 860) -> str:
    """The SVG of `tl` at `step` (an index into tl.events; None: the whole run, no cursor)."""
    current = tl.events[step] if step is not None and tl.events else None
    lane_h = memory.lane_height(tl)      # the memory lane, when the run counted it
    lane = (memory.svg_state_lane if memory.has_state(tl) else memory.svg_lane) if lane_h else None
    return paint(sc.scene(tl, t_max), current, width, functools.partial(lane, tl) if lane else None, lane_h,
                 tl.kind, -1 if step is None else step)


def paint(s: sc.Scene, current=None, width: int = 860, lane=None, lane_h: int = 0, view: str = "",
          step: int = -1) -> str:
    """A scene (scene.py) as SVG at the moment `current` (an event of the run) ended: each primitive as SVG
    elements; what is done in colour, what is still to come a ghost (or not yet shown), nothing decided here but
    how a primitive looks in a frame. `lane(x, top, left, plot_w, cursor)`: the memory lane's SVG, `lane_h` high."""
    t_max = s.t_max
    plot_w = width - LEFT - RIGHT
    extra = (_lines(s.legend, LEFT, width - 8) - 1) * LEGEND_LINE
    plot_top = TOP + (SECTION_H if s.sections else 0)
    height = plot_top + s.p * ROW_H + lane_h + AXIS_H + LEGEND_H + extra
    cursor = current.t_end if current is not None else float("inf")
    current_pair = next((a.pair for a in s.arrows if a.pair and current in a.pair), None) \
        if current is not None and not current.is_compute else None

    def x(t: float) -> float:
        return LEFT + min(t, t_max) / t_max * plot_w

    def y(row: float) -> float:        # a row's middle
        return plot_top + row * ROW_H + ROW_H / 2

    out = [f'<svg class="pp-timeline-frame" data-step="{step}" '
           f'data-view="{view}" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
           f'style="width:100%; max-width:{width}px; height:auto" font-family="sans-serif" font-size="11">', DEFS]
    for r in s.rows:
        out.append(f'<text x="{LEFT - 8}" y="{y(r.row) + 4}" text-anchor="end">{escape(r.text, quote=False)}</text>')
        if r.lane:     # a lane's thin row, named at its left
            out.append(f'<text x="{LEFT - 8}" y="{y(r.row + sc.LANE_STEP) + 3:.1f}" text-anchor="end" '
                       f'font-size="9" fill="#666">{escape(r.lane, quote=False)}</text>')
        if r.note:     # a second line ("dp 1, pp 1"), above the label where a lane is under it
            out.append(f'<text x="{LEFT - 8}" y="{y(r.row) + (-10 if r.lane else 16)}" text-anchor="end" '
                       f'font-size="9" fill="#666">{escape(r.note, quote=False)}</text>')
    for h in s.shades:     # idle, up to the cursor
        out.append(f'<rect x="{x(h.t0):.1f}" y="{y(h.row) - h.height * ROW_H / 2:.1f}" '
                   f'width="{x(min(cursor, h.t1)) - x(h.t0):.1f}" height="{h.height * ROW_H:.1f}" fill="url(#pp-idle)"/>')
    for b in s.boxes:      # done in colour, the part still to come as a ghost
        h = b.height * ROW_H
        top = y(b.row) - h / 2
        x0, x1 = x(b.t0), max(x(b.t1), x(b.t0) + 1.5)
        xc = min(max(x(cursor), x0), x1) if cursor < b.t1 else x1
        tip = f"<title>{escape(b.tip)}</title>" if b.tip else ""
        edge = ' stroke="white" stroke-width="0.8"' if b.edge else ""
        if xc < x1:
            out.append(f'<rect x="{xc:.1f}" y="{top:.1f}" width="{x1 - xc:.1f}" height="{h:.1f}" fill="{b.colour}" '
                       f'opacity="{GHOST}"{edge}>{tip}</rect>')
        if xc > x0:
            out.append(f'<rect x="{x0:.1f}" y="{top:.1f}" width="{xc - x0:.1f}" height="{h:.1f}" fill="{b.colour}"'
                       f'{edge}>{tip}</rect>')
        if current is not None and b.event is current:
            out.append(f'<rect x="{x0 - 1:.1f}" y="{top - 1:.1f}" width="{x1 - x0 + 2:.1f}" height="{h + 2:.1f}" '
                       f'fill="none" stroke="#111" stroke-width="2"/>')
        if b.label and x1 - x0 > max(14, 6.5 * len(b.label) + 2):   # only a label that fits
            fill = "white" if cursor >= b.t1 else "#888"
            out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{y(b.label_row) + 4}" text-anchor="middle" fill="{fill}" '
                       f'font-size="10" font-weight="bold" pointer-events="none">{escape(b.label, quote=False)}</text>')
    red = COLORS["wait"]
    for a in s.arrows:
        if a.lost:         # a send no receive took: once sent
            if a.t0 <= cursor:
                out.append(f'<line class="pp-lost" x1="{x(a.t0):.1f}" y1="{y(a.row0):.1f}" x2="{x(a.t1):.1f}" '
                           f'y2="{y(a.row1):.1f}" stroke="{a.colour}" stroke-width="1.2" stroke-dasharray="3,2">'
                           f'<title>{escape(a.tip)}</title></line><text x="{x(a.t1):.1f}" y="{y(a.row1) + 4:.1f}" '
                           f'fill="{a.colour}" font-size="12" text-anchor="middle">✕</text>')
            continue
        bold = a.pair == current_pair and current_pair is not None
        opacity = 1 if bold else (0.85 if a.t1 <= cursor else GHOST)
        out.append(f'<line x1="{x(a.t0):.1f}" y1="{y(a.row0):.1f}" x2="{x(a.t1):.1f}" y2="{y(a.row1):.1f}" '
                   f'stroke="{a.colour}" stroke-width="{3 if bold else 1.2}" opacity="{opacity}" '
                   f'marker-end="url(#pp-head-{a.phase})"/>')
    for j in s.joins:      # once the last member is done
        if j.t <= cursor:
            out.append(f'<line x1="{x(j.t):.1f}" y1="{y(j.row0):.1f}" x2="{x(j.t):.1f}" y2="{y(j.row1):.1f}" '
                       f'stroke="{j.colour}" stroke-width="1.5" stroke-dasharray="3,2"/>')
    for w in s.waits:      # once begun
        if w.t0 > cursor:
            continue
        x0, x1, top = x(w.t0), x(w.t1), y(w.row) - sc.WAIT * ROW_H / 2
        out.append(f'<rect class="pp-wait" x="{x0:.1f}" y="{top:.1f}" width="{max(x1 - x0, 3):.1f}" '
                   f'height="{sc.WAIT * ROW_H:.1f}" fill="{red}" fill-opacity="0.13" stroke="{red}" stroke-width="1.4" '
                   f'stroke-dasharray="4,2"><title>{escape(w.tip)}</title></rect>')
        label, edge = escape(w.label), x(t_max)
        fits = x0 + 4 + 5.6 * len(w.label) < edge
        out.append(f'<text x="{x0 + 4 if fits else edge - 2:.1f}" y="{y(w.row) - BOX_H / 2 - 3:.1f}" '
                   f'fill="{red}" font-size="10" text-anchor="{"start" if fits else "end"}" '
                   f'pointer-events="none">{label}</text>')
        if w.until:
            out.append(f'<text x="{x1 - 3:.1f}" y="{y(w.row) + 4}" fill="{red}" font-size="9" '
                       f'text-anchor="end">{escape(w.until)}</text>')
    for c in s.crosses:    # once reached
        if c.t > cursor:
            continue
        out.append(f'<text class="pp-end" x="{x(c.t):.1f}" y="{y(c.row) + 5}" fill="{red}" font-size="15" '
                   f'font-weight="bold" text-anchor="middle">✕<title>{escape(c.tip)}</title></text>'
                   f'<text x="{x(c.t) + 9:.1f}" y="{y(c.row) - BOX_H / 2 + 2:.1f}" fill="{red}" '
                   f'font-size="10">{escape(c.words)}</text>')
    for k in s.marks:      # what the run points out: outlined, and said above it
        x0, x1, h = x(k.t0), max(x(k.t1), x(k.t0) + 1.5), k.height * ROW_H
        out.append(f'<rect x="{x0 - 2:.1f}" y="{y(k.row) - h / 2:.1f}" width="{x1 - x0 + 4:.1f}" '
                   f'height="{h:.1f}" fill="none" stroke="{red}" stroke-width="1.6"/>'
                   f'<text x="{x0:.1f}" y="{y(k.row) - h / 2 - 3:.1f}" fill="{red}" font-size="10">'
                   f'{escape(k.words)}</text>')
    for c in s.sections:   # the run's parts, named above the ranks: a bracket and its words
        x0, x1, yb = x(c.t0), max(x(c.t1), x(c.t0) + 2), plot_top - 4
        out.append(f'<path class="pp-section" d="M{x0:.1f},{yb + 3} L{x0:.1f},{yb} L{x1:.1f},{yb} L{x1:.1f},{yb + 3}" '
                   f'fill="none" stroke="#777" stroke-width="1"/>')
        words = c.words if x1 - x0 > 5.6 * len(c.words) else c.words.rsplit(" ", 1)[-1]
        out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{yb - 3}" text-anchor="middle" font-size="9" fill="#444">'
                   f'{escape(words, quote=False)}</text>')
    for t in s.tallies:    # the bytes so far
        first, _, second = t.text(cursor).partition("\n")
        out.append(f'<text x="{width - RIGHT + 8}" y="{y(t.row) + (4 if not second else -2)}" fill="#444" '
                   f'font-size="10">{escape(first, quote=False)}</text>')
        if second:
            out.append(f'<text x="{width - RIGHT + 8}" y="{y(t.row) + 10}" fill="#444" font-size="10">'
                       f'{escape(second, quote=False)}</text>')
    if lane is not None:
        out.append(lane(x, plot_top + s.p * ROW_H, LEFT, plot_w, cursor))
    # time axis in ms, and the cursor
    axis_y = plot_top + s.p * ROW_H + lane_h + 4
    out.append(f'<line x1="{LEFT}" y1="{axis_y}" x2="{LEFT + plot_w}" y2="{axis_y}" stroke="#888"/>')
    for t in nice_ticks(t_max * 1e3):
        xt = x(t / 1e3)
        out.append(f'<line x1="{xt:.1f}" y1="{axis_y}" x2="{xt:.1f}" y2="{axis_y + 4}" stroke="#888"/>'
                   f'<text x="{xt:.1f}" y="{axis_y + 16}" text-anchor="middle" fill="#444">{t:g}</text>')
    out.append(f'<text x="{LEFT - 8}" y="{axis_y + 16}" text-anchor="end" fill="#444">time (ms)</text>')
    if current is not None:
        xc = x(cursor)
        out.append(f'<line x1="{xc:.1f}" y1="{plot_top - 4}" x2="{xc:.1f}" y2="{axis_y}" stroke="{COLORS["cursor"]}" '
                   f'stroke-width="1.5"/><text x="{xc + 3:.1f}" y="{axis_y + 30}" fill="{COLORS["cursor"]}">'
                   f't = {cursor * 1e3:.2f} ms</text>')
    out.append(paint_legend(s.legend, LEFT, height - 8 - extra, right=width - 8))
    out.append("</svg>")
    return "\n".join(out)
