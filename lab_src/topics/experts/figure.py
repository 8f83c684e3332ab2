"""Q25's picture: where one MoE layer's tokens went. Three panels, drawn by the lab's renderer (views/static.py):

    sent      the rows each rank sent to each rank in the dispatch (a matrix: the diagonal stays on its rank)
    load      the assignments each expert received, stacked by source rank, against the capacity per source rank
    dropped   the assignments each rank dropped (over an expert's capacity)

    moe_view(outcome)                                         the timeline of a case (the kind's view): each rank's
                                                              all-to-alls and all-reduces, named per step and phase
    routing_figure(sent, load, dropped, capacity, title)     sent: [[rows]] (ep x ep); load: [[rows per source]] per
                                                              expert; dropped: [n per rank]; capacity: int or None
    example_routing()                                         the rule on random tokens of 4 ranks (EXAMPLE, recorded)
"""
from __future__ import annotations


COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]


def routing_figure(sent: list, load: list, dropped: list, capacity: int | None, title: str):
    from lab_src.views.static import TimelineFigure
    ep = len(sent)
    fig = TimelineFigure(figsize=(11, 3.4), layout="constrained")
    a, b, c = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1.5, 1]})
    a.imshow(sent, cmap="Blues")
    top = max((v for row in sent for v in row), default=0)
    for i in range(ep):
        for j in range(ep):
            a.text(j, i, str(sent[i][j]) + (" (local)" if i == j else ""), ha="center", va="center", fontsize=8,
                   color="white" if sent[i][j] > top / 2 else "black")
    a.set_xticks(range(ep), [f"to {j}" for j in range(ep)], fontsize=7)
    a.set_yticks(range(ep), [f"rank {i}" for i in range(ep)], fontsize=7)
    a.set_title("rows sent in the dispatch\n(diagonal: stays on its rank)", fontsize=8)
    bottom = [0] * len(load)
    for src in range(len(load[0]) if load else 0):
        ys = [row[src] for row in load]
        b.bar(range(len(load)), ys, bottom=bottom, color=COLORS[src % len(COLORS)], edgecolor="black", linewidth=0.4,
              label=f"from rank {src}")
        bottom = [u + v for u, v in zip(bottom, ys)]
    if capacity is not None:
        b.axhline(capacity * (len(load[0]) if load else 1), color="#c44e52", linestyle="--", linewidth=1,
                  label="capacity x source ranks")
    per = len(load) // ep if ep else 1
    b.set_xticks(range(len(load)), [f"e{e}\nr{e // per}" for e in range(len(load))], fontsize=7)
    b.set_title("assignments each expert received (e: expert, r: its rank)", fontsize=8)
    b.legend(fontsize=6, frameon=False)
    c.bar(range(len(dropped)), dropped, color="#c44e52", edgecolor="black", linewidth=0.4)
    c.set_xticks(range(len(dropped)), [f"rank {r}" for r in range(len(dropped))], fontsize=7)
    c.set_title("assignments dropped (over capacity)", fontsize=8)
    fig.suptitle(title, fontsize=9)
    return fig


# The rule (q25's route) on random tokens of 4 ranks, one router: 8 experts, top-2, capacity factor 1.0, 64 tokens
# and h = 16 a rank, seed 0. Recorded, not computed: the student package holds no rule. tests/test_q25_dispatch.py
# computes it again with the grader's rule and compares.
EXAMPLE = {"sent": [[18, 32, 24, 26], [26, 24, 32, 21], [27, 19, 32, 14], [26, 32, 14, 32]],
           "load": [[16, 16, 16, 16], [2, 10, 11, 10], [16, 13, 9, 16], [16, 11, 10, 16], [16, 16, 16, 5],
                    [8, 16, 16, 9], [10, 10, 10, 16], [16, 11, 4, 16]],
           "dropped": [28, 25, 36, 24], "capacity": 16}


def example_routing() -> dict:
    """EXAMPLE, a copy: {"sent", "load", "dropped", "capacity"}."""
    return {k: ([list(r) for r in v] if k in ("sent", "load") else list(v) if isinstance(v, list) else v)
            for k, v in EXAMPLE.items()}


COMPUTE_FREE = "no compute drawn: between its bars a rank runs its layers and experts"


def moe_view(outcome) -> dict:
    """The timeline of a q25 case (the kind's declared view): each rank's all-to-alls and all-reduces, named per step
    above the ranks: the forward's (a counts exchange and two of tokens a layer), the backward's (two a layer), the
    gradients' sync."""
    from lab_src.views.saved import case_view
    view = {**case_view(outcome), "title": f"q25: {outcome.case.label}; every collective of each rank, per step",
            "compute_free": COMPUTE_FREE}
    events = view["events"]
    parts: dict[tuple, list[int]] = {}
    for r, o in outcome.obs.items():
        a2a = o.get("a2a") or {}
        nf, nb = len(a2a.get("forward") or []), len(a2a.get("backward") or [])
        mine = sorted((i for i, e in enumerate(events) if e.rank == r and e.is_collective),
                      key=lambda i: (events[i].t_start, events[i].t_end))
        at, step = 0, 0
        while at < len(mine) and nf:
            parts.setdefault((step, "forward"), []).extend(mine[at:at + nf])
            parts.setdefault((step, "backward"), []).extend(mine[at + nf:at + nf + nb])
            at += nf + nb
            sync = at
            while sync < len(mine) and events[mine[sync]].kind != "all_to_all":
                sync += 1
            parts.setdefault((step, "sync"), []).extend(mine[at:sync])
            at, step = sync, step + 1
    words = {"forward": "fwd", "backward": "bwd", "sync": "sync"}
    view["sections"] = [(f"step {k}: fwd" if phase == "forward" else words[phase], idx)
                        for (k, phase), idx in sorted(parts.items(), key=lambda kv: (kv[0][0], list(words).index(kv[0][1])))
                        if idx]
    return view
