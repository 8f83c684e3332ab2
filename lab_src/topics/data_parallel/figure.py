"""Q19's opening picture: a ring all-reduce over n ranks, step by step, drawn from the algorithm's own rule.

    ring_figure(n=4)

One panel per step: before the first, after each of the n - 1 steps of reduce-scatter and each of the n - 1
of all-gather. In each, one row per rank, one cell per chunk of the tensor: the cell says whose inputs it
holds the sum of, its shade how many (dark: all n, the finished sum). A thick edge marks the chunk each rank
sends to the next rank in that step. The chunks each rank sends and adds follow the rule of the contract
(lab_src/exercises.py, `ring_all_reduce`): in reduce-scatter step s, rank r sends chunk (r - s) mod n; in
all-gather step s, chunk (r + 1 - s) mod n.
"""
from __future__ import annotations

SHADES = ("#f4f4f4", "#d6e6f4", "#9ecae1", "#4292c6", "#08519c", "#08306b", "#08306b", "#08306b", "#08306b")


def ring_steps(n: int) -> list[tuple[str, list[list[set]], list[int | None]]]:
    """[(title, holds[rank][chunk] = the ranks whose inputs that chunk sums, chunk each rank sends next)]."""
    holds = [[{r} for _ in range(n)] for r in range(n)]
    out = []
    for phase in ("reduce-scatter", "all-gather"):
        for s in range(n - 1):
            sends = [(r - s) % n if phase == "reduce-scatter" else (r + 1 - s) % n for r in range(n)]
            if not out:
                out.append(("before: each rank its own tensor", [[set(c) for c in row] for row in holds], sends))
            else:
                out[-1] = (out[-1][0], out[-1][1], sends)
            new = [[set(c) for c in row] for row in holds]
            for r in range(n):
                c = sends[r]
                nxt = (r + 1) % n
                new[nxt][c] = (new[nxt][c] | holds[r][c]) if phase == "reduce-scatter" else set(holds[r][c])
            holds = new
            out.append((f"after {phase} step {s + 1}", [[set(c) for c in row] for row in holds], [None] * n))
    return out


def ring_figure(n: int = 4):
    """A matplotlib figure of the ring's two phases on n ranks."""
    from matplotlib.patches import Rectangle

    from lab_src.views.static import TimelineFigure
    steps = ring_steps(n)
    fig = TimelineFigure(figsize=(2.0 * len(steps) + 0.6, 0.55 * n + 1.3), layout="constrained")
    axes = fig.subplots(1, len(steps))
    for ax, (title, holds, sends) in zip(axes, steps):
        for r in range(n):
            y = n - 1 - r
            for c in range(n):
                k = len(holds[r][c])
                ax.add_patch(Rectangle((c, y), 0.92, 0.82, fc=SHADES[min(k, n if k == n else k - 1)] if k < n
                                       else SHADES[5], ec="black" if sends[r] == c else "#999",
                                       lw=2.4 if sends[r] == c else 0.6))
                text = "".join(str(j) for j in sorted(holds[r][c])) if k < n else "sum"
                ax.text(c + 0.46, y + 0.41, text, ha="center", va="center", fontsize=7,
                        color="white" if k >= 3 or k == n else "black")
            if sends[r] is not None:
                ax.text(n + 0.05, y + 0.41, f"→ {(r + 1) % n}", fontsize=7, va="center", color="#333")
        ax.set_xlim(-0.1, n + 0.8)
        ax.set_ylim(-0.2, n + 0.1)
        ax.set_yticks([n - 1 - r + 0.41 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=7)
        ax.set_xticks([c + 0.46 for c in range(n)], [f"c{c}" for c in range(n)], fontsize=7)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        ax.set_title(title, fontsize=8)
    fig.suptitle(f"A ring all-reduce on {n} ranks: n - 1 = {n - 1} steps of reduce-scatter, then {n - 1} of all-gather. "
                 f"Each cell: whose inputs its chunk sums; thick edge: the chunk sent to the next rank (→) in the "
                 f"next step", fontsize=9)
    return fig


def bucket_events(p: int = 4, m: int = 8, buckets: int = 3, ring_share: float = 0.3):
    """The schedule model's 1F1B step (views/schedule_figure.py's, messages free), and on each rank, in its lane 1,
    the rings of `buckets` buckets: bucket k's gradients are final k + 1 buckets' share into the stage's last
    backward (the last layers' first), and its ring, `ring_share` of a backward long, starts then or when the
    ring before it ends (one reducing thread)."""
    from dataclasses import replace

    from lab_src.views.ideal import ideal_events
    from lab_src.views.schedule_figure import FREE_MESSAGES
    events = ideal_events(p, m, FREE_MESSAGES, schedule="1f1b")
    out = list(events)
    for r in range(p):
        last = max((e for e in events if e.rank == r and e.kind == "backward"), key=lambda e: e.t_start)
        duration = last.t_end - last.t_start
        free = 0.0
        for k in range(buckets):
            start = max(last.t_start + duration * (k + 1) / buckets, free)
            free = start + ring_share * duration
            out.append(replace(last, kind="allreduce_dp", microbatch=None, peer=None, shape=None, bytes=0,
                               t_start=start, t_end=free, group=(r,), lane=1))
    return out


def buckets_figure(p: int = 4, m: int = 8, buckets: int = 3):
    """A matplotlib figure: 1F1B on p stages with each stage's bucket rings in the thin row under it."""
    from lab_src.views.prepare import prepare
    from lab_src.views.static import figure
    events = bucket_events(p, m, buckets)
    tl = prepare(events, p, m, kind="1F1B",
                 note=f"a model, not a measurement: a backward twice a forward, {buckets} buckets per stage, a ring "
                      f"0.3 of a backward", align=False)
    return figure([tl], f"Buckets under 1F1B: {p} stages, {m} micro-batches; each stage's rings (lane 1) start in "
                        f"its last backward")


def ring_view(outcome) -> dict:
    """The view of a q19 case (the kind's declared view: the check's timeline and the grader's saved run alike), each
    call of the ring named above the ranks by its tensor's length (and layer)."""
    from lab_src.views.saved import case_view
    view = {**case_view(outcome), "title": f"q19: {outcome.case.label}; every message of each rank, each call's "
                                           f"length above",
            "compute_free": COMPUTE_FREE}
    view["sections"] = calls(outcome, view["events"])
    return view


def calls(outcome, events) -> list:
    """[(words, [indices into `events`])]: each length's call of the ring, its messages on every rank. A rank's
    messages are in the order of its calls (one call after another, a barrier between), each call's count in its
    record (`sends`, `recvs`); none where a rank left no record (a stopped run)."""
    from lab_src.topics.data_parallel.records import SEED_LAYERS
    names = {v: k for k, v in SEED_LAYERS.items()}
    parts: dict[int, list[int]] = {}
    for r, o in outcome.obs.items():
        runs = o.get("runs") or []
        mine = sorted((i for i, e in enumerate(events) if e.rank == r and (e.is_send or e.is_recv)),
                      key=lambda i: (events[i].t_start, events[i].t_end))
        at = 0
        for k, rec in enumerate(runs):
            n = len(rec.get("sends") or []) + len(rec.get("recvs") or [])
            parts.setdefault(k, []).extend(mine[at:at + n])
            at += n
    lengths = [rec.get("length") for rec in (next(iter(outcome.obs.values()), {}).get("runs") or [])]
    return [(f"{names[n]}: {n:,}" if n in names else f"{n:,}", parts[k])
            for k, n in enumerate(lengths) if parts.get(k) and n is not None]


# what the timeline says in place of a bubble: the ring has no schedule, and its compute is not recorded
COMPUTE_FREE = "no compute recorded: between its bars a rank adds, or copies, the chunk it received"
