"""Text pictures of a run's schedule, from its events.

`time_grid` draws measured time, one row per rank:

    rank 0 |0fff1fff2fff3fff--------------------0bbb1bbb2bbb3bbb|
    rank 1 |----0fff1fff2fff3fff------------0bbb1bbb2bbb3bbb....|

`f` forward, `b` backward (each compute box in its operation's letter, `Op.letter`, lower-cased), a digit
where micro-batch k's box starts, `-` inside a send or receive, `=` inside an all-reduce (q14), `.` idle.
`step_grid` draws the same schedule in logical steps (each compute box one step, placed as soon as its
input exists), which is what the error messages show.
"""
from __future__ import annotations

from lab_src.pipeline.ops import Op
from lab_src.pipeline.trace import COMPUTE, Event

LEGEND = "f forward, b backward (a digit marks where micro-batch k starts), - send/recv, . idle"
IN_LEGEND = (Op.FORWARD, Op.BACKWARD)      # the compute operations LEGEND names; others are named where they ran


def time_grid(events: list[Event], p: int, width: int = 72) -> str:
    if not events:
        return "(no events recorded)"
    t0 = min(e.t_start for e in events)
    t1 = max(e.t_end for e in events)
    span = max(t1 - t0, 1e-9)
    rows = []
    for r in range(p):
        row = ["."] * width
        mine = [e for e in events if e.rank == r]
        for e in sorted(mine, key=lambda e: e.is_compute):  # compute drawn last, over messaging
            a = int((e.t_start - t0) / span * width)
            b = max(a + 1, int(round((e.t_end - t0) / span * width)))
            fill = e.op.letter.lower() if e.is_compute else "=" if e.is_collective else "-"
            for c in range(a, min(b, width)):
                row[c] = fill
            if e.is_compute and a < width:
                row[a] = str(e.microbatch % 10)
        rows.append(f"rank {r} |{''.join(row)}|")
    scale = f"{'':7}0 ms{'':{width - 8}}{span * 1e3:.1f} ms"
    ran = {e.op for e in events if e.is_compute}
    legend = LEGEND + "".join(f", {op.letter.lower()} {op.value}" for op in Op if op in ran and op not in IN_LEGEND)
    legend += ", = all-reduce" if any(e.is_collective for e in events) else ""
    return "\n".join(rows + [scale, legend])


def logical_steps(events: list[Event], p: int) -> dict[tuple[int, str, int], int]:
    """The step of each compute box: after the rank's previous box and after the box that feeds it (`_feed`)."""
    step: dict[tuple[int, str, int], int] = {}
    by_rank = {r: sorted((e for e in events if e.rank == r and e.kind in COMPUTE), key=lambda e: e.t_start)
               for r in range(p)}
    pending = {r: list(v) for r, v in by_rank.items()}
    last = {r: -1 for r in range(p)}
    progress = True
    while progress and any(pending.values()):
        progress = False
        for r in range(p):
            while pending[r]:
                e = pending[r][0]
                k = e.microbatch
                feed = _feed(Op(e.kind), r, p, k)
                if feed is not None and feed not in step and any(
                        (x.rank, x.kind, x.microbatch) == feed for x in by_rank.get(feed[0], [])):
                    break  # its input is not placed yet
                at = max(last[r] + 1, step.get(feed, -1) + 1 if feed else 0)
                step[(r, e.kind, k)] = at
                last[r] = at
                pending[r].pop(0)
                progress = True
    return step


def _feed(op: Op, r: int, p: int, k: int) -> tuple[int, str, int] | None:
    """The box whose output micro-batch k's `op` on rank r takes: the same operation on the neighbouring
    stage (the previous one for a forward, the next for a backward), or where there is none, the operation
    of the same rank it continues (the last stage's backward continues its forward, W its I)."""
    if op.chained:
        src = r - 1 if op.phase == "forward" else r + 1
        if 0 <= src < p:
            return src, op.value, k
    return (r, op.after.value, k) if op.after is not None else None


def step_grid(events: list[Event], p: int) -> str:
    steps = logical_steps(events, p)
    if not steps:
        return "(no forward or backward recorded)"
    n = max(steps.values()) + 1
    cells = {(r, s): f"{Op(kind).letter}{k}" for (r, kind, k), s in steps.items()}
    rows = []
    for r in range(p):
        rows.append(f"rank {r} | " + " ".join(f"{cells.get((r, s), '.'):<3}" for s in range(n)).rstrip())
    return "\n".join(rows)
