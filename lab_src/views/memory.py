"""The memory lane of the timeline: what each rank holds for its backwards, over the step.

Every event a pipeline case records carries `held`, the bytes of tensors saved for backward that the
rank held when the event ended (harness/memory.py). Drawn per rank as a step line under the timeline,
it shows the schedule's memory: under All-Forward-All-Backward every rank climbs through all m
forwards before anything is freed; under One-Forward-One-Backward rank r levels off after
min(p - r, m) micro-batches. The same lane can show a count instead of bytes (`unit="micro-batches"`:
the schedule pictures draw the micro-batches awaiting their backward).

    has_memory(tl)              is there anything to draw
    draw_lane(ax, tl)           matplotlib (static.py)
    svg_lane(tl, ...)           inline SVG (svg.py, the widget's frames)
    peak_by_rank(events, p)     the largest value each rank held
    modelled(ideal, measured, p)  the ideal step's lane, from what one micro-batch cost each rank in the run
"""
from __future__ import annotations

from lab_src.pipeline.trace import Event

RANK_COLORS = ("#4c78a8", "#e45756", "#54a24b", "#b279a2", "#f58518", "#72b7b2", "#9d755d", "#bab0ac")


def has_memory(tl) -> bool:
    return any(e.held for e in tl.events)


def series(events: list[Event], rank: int) -> list[tuple[float, int]]:
    """(time, held) after each of the rank's events, from (0, 0): a step function."""
    points = [(0.0, 0)]
    for e in sorted((e for e in events if e.rank == rank), key=lambda e: e.t_end):
        points.append((e.t_end, e.held))
    return points


def holding(events: list[Event]) -> list[Event]:
    """The events with `held` set to the micro-batches (or chunk forwards) the rank holds awaiting their
    backward after each (`Op.holds`: a forward adds one, a backward releases it)."""
    from dataclasses import replace

    from lab_src.pipeline.ops import Op
    held: dict[int, int] = {}
    out = []
    for e in sorted(events, key=lambda e: (e.t_end, e.rank)):
        op = Op.of(e.kind)
        if op is not None and op.holds:
            held[e.rank] = held.get(e.rank, 0) + op.holds
        out.append(replace(e, held=held.get(e.rank, 0)))
    return out


def modelled(ideal: list[Event], measured: list[Event], p: int) -> list[Event]:
    """The ideal step's events with `held` in bytes, for its memory lane: the micro-batches each rank holds
    under the schedule times what one cost that rank in the measured run (its peak bytes over the most
    micro-batches it held then). Unchanged when the run measured no memory."""
    if not any(e.held for e in measured):
        return ideal
    from dataclasses import replace
    peak_bytes = peak_by_rank(measured, p)
    peak_count = peak_by_rank(holding([e for e in measured if e.is_compute]), p)
    per = {r: peak_bytes[r] / peak_count[r] if peak_count[r] else 0 for r in range(p)}
    return [replace(e, held=round(e.held * per.get(e.rank, 0))) for e in holding(ideal)]


def peak_by_rank(events: list[Event], p: int) -> dict[int, int]:
    return {r: max((e.held for e in events if e.rank == r), default=0) for r in range(p)}


def scale(peak: float, unit: str = "bytes") -> tuple[float, str]:
    """(divisor, label) to show values up to `peak` in readable units."""
    if unit != "bytes":
        return 1.0, unit
    if peak >= 1 << 20:
        return float(1 << 20), "MiB"
    return float(1 << 10), "KiB"


def describe_peaks(events: list[Event], p: int) -> str:
    """'rank 0 1.2 MiB, rank 1 0.9 MiB, ...': each rank's peak activation memory."""
    peaks = peak_by_rank(events, p)
    div, name = scale(max(peaks.values(), default=0))
    return ", ".join(f"rank {r} {v / div:.1f} {name}" for r, v in peaks.items())


def draw_lane(ax, tl, t_max: float | None = None, unit: str = "bytes") -> None:
    """One step line per rank on `ax`, on the timeline's time axis (ms)."""
    t_max = t_max or tl.span or 1e-3
    peak = max((e.held for e in tl.events), default=0)
    div, name = scale(peak, unit)
    for r in range(tl.p):
        pts = series(tl.events, r)
        ax.step([t * 1e3 for t, _ in pts], [v / div for _, v in pts], where="post", lw=1.4,
                color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}")
    ax.set_xlim(0, t_max * 1e3 * 1.01)
    ax.set_ylim(0, max(peak / div * 1.15, 1e-9))
    what = "held for backward" if unit == "bytes" else "awaiting backward"
    ax.set_ylabel(f"{what}\n({name})", fontsize=8)
    ax.set_title(f"{tl.kind}: activation memory per rank (peak: "
                 + ", ".join(f"rank {r} {v / div:.3g}" for r, v in peak_by_rank(tl.events, tl.p).items())
                 + f" {name})", fontsize=9.5, loc="left")
    ax.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.grid(color="#e4e4e4", lw=0.6)
    ax.set_axisbelow(True)


LANE_H = 70


def svg_lane(tl, x, top: float, left: float, width: float, cursor: float = float("inf")) -> str:
    """The lane as SVG: a polyline per rank up to the cursor, its future as a ghost. `x` maps seconds
    to pixels (the frame's own)."""
    peak = max((e.held for e in tl.events), default=0) or 1
    div, name = scale(peak)
    h = LANE_H - 16

    def y(v: float) -> float:
        return top + 12 + h - v / peak * h

    out = [f'<text x="{left - 8}" y="{top + 16}" text-anchor="end" fill="#444">memory</text>',
           f'<text x="{left - 8}" y="{top + 28}" text-anchor="end" fill="#777" font-size="9">held for</text>',
           f'<text x="{left - 8}" y="{top + 38}" text-anchor="end" fill="#777" font-size="9">backward</text>',
           f'<line x1="{left}" y1="{y(0):.1f}" x2="{left + width}" y2="{y(0):.1f}" stroke="#ccc"/>',
           f'<text x="{left + width + 8}" y="{y(peak) + 4:.1f}" fill="#444">{peak / div:.3g} {name}</text>']
    for r in range(tl.p):
        done, ghost = [], []
        for (t0, v), (t1, _) in zip(series(tl.events, r), series(tl.events, r)[1:] + [(tl.span, 0)]):
            seg = [(x(t0), y(v)), (x(t1), y(v))]
            (done if t1 <= cursor else ghost).extend(seg)
        color = RANK_COLORS[r % len(RANK_COLORS)]
        out.append(f'<text x="{left + 6 + 52 * r}" y="{top + 9}" fill="{color}" font-size="9">— rank {r}</text>')
        for pts, opacity in ((ghost, 0.2), (done, 1)):
            if pts:
                path = " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)
                out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5" '
                           f'opacity="{opacity}"><title>rank {r}</title></polyline>')
    return "\n".join(out)


# The training state beside the activations (the sharding kinds: events carry `state`, pipeline/trace.py): a row
# per rank of stacked bands, bottom to top in this order; each band's height is the bytes of that kind the rank held
# when its events ended.
STACK = ("parameters", "optimizer", "gradients", "gathered", "activations")
KIND_COLORS = {"parameters": "#9e9e9e", "optimizer": "#b279a2", "gradients": "#f58518", "gathered": "#72b7b2",
               "activations": "#4c78a8"}
KIND_NAMES = {"parameters": "parameters kept", "optimizer": "optimizer state", "gradients": "gradients (.grad)",
              "gathered": "gathered whole weights", "activations": "activations (saved for backward)"}
STATE_ROW = 30      # px of a rank's row in the SVG lane


def has_state(tl) -> bool:
    return any(e.state for e in tl.events)


def by_kind(e: Event) -> dict[str, int]:
    from lab_src.pipeline.trace import STATE_KINDS
    return {"activations": e.held, **dict(zip(STATE_KINDS, e.state or ()))}


def kinds_held(events: list[Event]) -> list[str]:
    """The kinds of STACK any event holds bytes of."""
    return [k for k in STACK if any(by_kind(e).get(k, 0) for e in events)]


def state_series(events: list[Event], rank: int) -> list[tuple[float, dict[str, int]]]:
    """(time, bytes per kind) after each of the rank's events, from time 0 with its first event's values (what a
    rank holds of the training state before its first event: its parameters)."""
    mine = sorted((e for e in events if e.rank == rank and e.state), key=lambda e: e.t_end)
    if not mine:
        return []
    first = {**by_kind(mine[0]), "activations": 0, "gradients": 0, "gathered": 0}
    return [(0.0, first)] + [(e.t_end, by_kind(e)) for e in mine]


def peak_of(points: list[tuple[float, dict[str, int]]]) -> tuple[int, dict[str, int]]:
    """(the largest total of a rank's state_series, the bytes per kind at that moment)."""
    best = max(points, key=lambda tv: sum(tv[1].values()), default=(0.0, {}))[1]
    return sum(best.values()), best


def state_peaks(events: list[Event], p: int) -> dict[int, tuple[int, dict[str, int]]]:
    """rank -> (its largest total, the bytes per kind at that moment)."""
    return {r: peak_of(state_series(events, r)) for r in range(p)}


def describe_state(events: list[Event], p: int) -> list[str]:
    """One line per rank: its peak and what it was made of ('rank 0: 120 KiB (parameters 61 KiB, ...)')."""
    peaks = state_peaks(events, p)
    div, name = scale(max((t for t, _ in peaks.values()), default=0))
    return [f"rank {r}: {total / div:.1f} {name} (" + ", ".join(
        f"{k} {held[k] / div:.1f}" for k in STACK if held.get(k)) + ")" for r, (total, held) in peaks.items()]


def draw_state_lane(ax, tl, t_max: float | None = None) -> None:
    """A row per rank of stacked bands (STACK), on the timeline's time axis (ms), every row on one scale."""
    t_max = t_max or tl.span or 1e-3
    kinds = kinds_held(tl.events)
    rows = {r: state_series(tl.events, r) for r in range(tl.p)}
    peaks = {r: peak_of(pts) for r, pts in rows.items()}
    top = max((t for t, _ in peaks.values()), default=0) or 1
    div, name = scale(top)
    for r, pts in rows.items():
        base = tl.p - 1 - r
        if not pts:
            continue
        ts = [t * 1e3 for t, _ in pts] + [t_max * 1e3]
        below = [0.0] * len(pts)
        for k in kinds:
            above = [b + v.get(k, 0) / top * 0.85 for b, (_, v) in zip(below, pts)]
            ax.fill_between(ts, [base + b for b in below] + [base + below[-1]],
                            [base + a for a in above] + [base + above[-1]], step="post", lw=0,
                            color=KIND_COLORS[k], label=KIND_NAMES[k] if r == 0 else None)
            below = above
    ax.set_xlim(0, t_max * 1e3 * 1.01)
    ax.set_ylim(-0.05, tl.p)
    ax.set_yticks([tl.p - 1 - r + 0.4 for r in range(tl.p)], [f"rank {r}" for r in range(tl.p)], fontsize=8)
    ax.set_title("memory per rank, by kind (row height: " + f"{top / div:.3g} {name}" + "; peaks: "
                 + ", ".join(f"rank {r} {t / div:.3g}" for r, (t, _) in peaks.items()) + f" {name})",
                 fontsize=9.5, loc="left")
    ax.legend(fontsize=7.5, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.grid(axis="x", color="#e4e4e4", lw=0.6)
    ax.set_axisbelow(True)


def lane_height(tl) -> int:
    """Pixels of the SVG memory lane: a row per rank for the training state, else the activations' lane."""
    if has_state(tl):
        return 22 + tl.p * STATE_ROW
    return LANE_H if has_memory(tl) else 0


def svg_state_lane(tl, x, top: float, left: float, width: float, cursor: float = float("inf")) -> str:
    """The training state's lane as SVG: per rank a stacked polygon per kind up to the cursor, its future as a
    ghost; every row on one scale (the largest total any rank held)."""
    kinds = kinds_held(tl.events)
    rows = {r: state_series(tl.events, r) for r in range(tl.p)}
    peaks = {r: peak_of(pts) for r, pts in rows.items()}
    peak = max((t for t, _ in peaks.values()), default=0) or 1
    div, name = scale(peak)
    h = STATE_ROW - 6
    out = [f'<text x="{left - 8}" y="{top + 12}" text-anchor="end" fill="#444">memory</text>']
    for i, k in enumerate(kinds):
        out.append(f'<rect x="{left + 4 + 150 * i}" y="{top + 3}" width="9" height="9" fill="{KIND_COLORS[k]}"/>'
                   f'<text x="{left + 16 + 150 * i}" y="{top + 11}" fill="#444" font-size="9">{KIND_NAMES[k]}</text>')
    for r, pts in rows.items():
        base = top + 18 + (r + 1) * STATE_ROW
        out.append(f'<text x="{left - 8}" y="{base - 6}" text-anchor="end" fill="#777" font-size="9">rank {r}</text>'
                   f'<line x1="{left}" y1="{base}" x2="{left + width}" y2="{base}" stroke="#ddd"/>')
        if not pts:
            continue
        total = peaks[r][0]
        out.append(f'<text x="{left + width + 8}" y="{base - 6}" fill="#444" font-size="10">peak '
                   f'{total / div:.3g} {name}</text>')
        ends = [t for t, _ in pts[1:]] + [tl.span]
        for part, opacity in (("all", 0.22), ("done", 1.0)):
            below = [0.0] * len(pts)
            for k in kinds:
                above = [b + v.get(k, 0) / peak * h for b, (_, v) in zip(below, pts)]
                upper, lower = [], []
                for (t0, _), t1, a, b in zip(pts, ends, above, below):
                    if part == "done" and t0 > cursor:
                        break
                    t1 = min(t1, cursor) if part == "done" else t1
                    upper += [(x(t0), base - a), (x(t1), base - a)]
                    lower += [(x(t0), base - b), (x(t1), base - b)]
                if upper:
                    path = " ".join(f"{a:.1f},{b:.1f}" for a, b in upper + lower[::-1])
                    out.append(f'<polygon points="{path}" fill="{KIND_COLORS[k]}" opacity="{opacity}" stroke="none">'
                               f'<title>rank {r}: {KIND_NAMES[k]}</title></polygon>')
                below = above
    return "\n".join(out)
