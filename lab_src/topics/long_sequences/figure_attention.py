"""Q24's pictures, drawn by the lab's renderer (views/static.py's TimelineFigure, a matplotlib figure):

    tiles_figure(n)          before any run: for each layout, the tiles (one chunk of queries by one of keys) each rank
                             computes at each step of a causal ring of n ranks, whole, on the diagonal, or skipped, and
                             each rank's work; what the prediction asks is left to the student (it is drawn at n = 4)
    blocks_figure(outcomes)  after the check: each run's blocks over time per rank, as the lab timed them (every matmul
                             a box, coloured by the ring's step it belongs to; every message a bar under it), and each
                             rank's forward work in tiles beside its row
    attention_view(outcome)  the timeline view of a case (the kind's declared view): its messages, each run named
"""
from __future__ import annotations

from lab_src.topics.long_sequences.records import LAYOUTS, balance, positions

STEP_COLOURS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")
MESSAGE_COLOUR = "#bbbbbb"


def chunk_tiles(rank: int, src: int, n: int, layout: str) -> list[tuple[int, int, str]]:
    """(query chunk, key chunk, "whole" | "diagonal" | "skipped") of rank's queries against src's keys, causal."""
    c = 2 if layout == "zigzag" else 1
    mine = [p // 1 for p in positions(rank, n, c, layout)]      # chunk indices (one row a chunk)
    theirs = positions(src, n, c, layout)
    out = []
    for qc in mine:
        for kc in theirs:
            out.append((qc, kc, "diagonal" if qc == kc else "whole" if kc < qc else "skipped"))
    return out


def computed(rank: int, src: int, n: int, layout: str) -> list[str]:
    """What the reference computes of each tile of a step: the zigzag ring computes the visible half of a block whole."""
    kinds = [k for _, _, k in chunk_tiles(rank, src, n, layout)]
    if layout == "zigzag" and src == rank:
        return ["whole" if k == "skipped" else k for k in kinds]    # its own block: one masked 2c x 2c product
    return kinds


def tiles_figure(n: int = 4):
    """For each layout, a row per rank and a column per step of a causal ring: the tiles the rank computes."""
    from lab_src.views.static import TimelineFigure
    fig = TimelineFigure(figsize=(10, 1.1 + 0.75 * n), layout="constrained")
    axes = fig.subplots(1, len(LAYOUTS))
    colours = {"whole": "#4c72b0", "diagonal": "#9ecae1", "skipped": "#f0f0f0"}
    for ax, layout in zip(axes, LAYOUTS):
        per = 2 if layout == "zigzag" else 1
        for r in range(n):
            for step in range(n):
                src = (r - step) % n
                kinds = computed(r, src, n, layout)
                for j, kind in enumerate(kinds):
                    x = step + (j % per) / per * 0.8 + 0.05
                    y = r + (j // per) / per * 0.8 + 0.05
                    ax.add_patch(_rect(x, y, 0.8 / per * 0.95, 0.8 / per * 0.95, colours[kind]))
                ax.text(step + 0.45, r + 0.92, f"K,V of rank {src}", ha="center", va="top", fontsize=6,
                        color="#555555")
            blocks = sum(k != "skipped" for s in range(n) for k in computed(r, (r - s) % n, n, layout)) / (per * per)
            ax.text(n + 0.1, r + 0.4, f"{blocks:g} block{'' if blocks == 1 else 's'}", va="center", fontsize=8)
        ax.set_xlim(-0.1, n + 1.2)
        ax.set_ylim(n + 0.05, -0.1)
        ax.set_xticks([s + 0.45 for s in range(n)], [f"step {s}" for s in range(n)], fontsize=8)
        ax.set_yticks([r + 0.45 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=8)
        held = "chunk r" if layout == "contiguous" else "chunks r and 2N-1-r"
        ax.set_title(f"{layout}: rank r holds {held}", fontsize=9)
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    for kind, colour in colours.items():
        axes[-1].add_patch(_rect(0, 0, 0, 0, colour, label={"whole": "computed", "diagonal": "computed, causal mask",
                                                            "skipped": "skipped: every key after every query"}[kind]))
    axes[-1].legend(fontsize=7, frameon=False, loc="lower right", bbox_to_anchor=(1.0, -0.35), ncol=3)
    fig.suptitle(f"a causal ring of N = {n} ranks, what each rank computes at each step (a block: S/N queries by "
                 f"S/N keys)", fontsize=10)
    return fig


def _rect(x, y, w, h, colour, label=None):
    from matplotlib.patches import Rectangle
    return Rectangle((x, y), w, h, facecolor=colour, edgecolor="#777777", linewidth=0.4, label=label)


def steps_of(rec: dict) -> list[int]:
    """For each matmul of a run's forward, the ring's step it belongs to: how many receives had completed before it."""
    ends = sorted(m[3] for m in rec["forward"]["recvs"])
    return [sum(1 for e in ends if e <= t0) for t0, _, _ in rec["forward"]["matmuls"]]


def blocks_figure(outcomes: list):
    """Each given (outcome, index, label) run's forward over time per rank: matmuls as boxes coloured by step,
    messages as thin bars under them, and each rank's work in tiles; None when there is nothing to draw."""
    from lab_src.harness.settings import settings_of
    from lab_src.topics.long_sequences.records import tile_flops
    from lab_src.views.static import TimelineFigure
    panels = []
    for outcome, index, label in outcomes:
        recs = {r: (o.get("runs") or [])[index] for r, o in sorted(outcome.obs.items())
                if len(o.get("runs") or []) > index and "forward" in (o.get("runs") or [])[index]}
        if len(recs) == outcome.case.stages:
            panels.append((outcome, index, label, recs))
    if not panels:
        return None
    n_max = max(p[0].case.stages for p in panels)
    fig = TimelineFigure(figsize=(10, 1.0 + 0.55 * n_max * len(panels)), layout="constrained")
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (outcome, index, label, recs) in zip(axes, panels):
        s = settings_of(outcome.case)
        run, n = s.runs[index], outcome.case.stages
        t0 = min(rec["forward"]["span"][0] for rec in recs.values())
        block = tile_flops(run, n, s.batch) * (4 if run["layout"] == "zigzag" else 1)   # S/N queries by S/N keys
        work = {r: sum(m[2] for m in rec["forward"]["matmuls"]) for r, rec in recs.items()}
        end = max(rec["forward"]["span"][1] for rec in recs.values()) - t0
        for r, rec in recs.items():
            for (a, b, _), step in zip(rec["forward"]["matmuls"], steps_of(rec)):
                ax.barh(r - 0.12, (b - a) * 1e3, left=(a - t0) * 1e3, height=0.5,
                        color=STEP_COLOURS[step % len(STEP_COLOURS)], lw=0)
            for peer, _, a, b in rec["forward"]["recvs"]:
                ax.barh(r + 0.3, (b - a) * 1e3, left=(a - t0) * 1e3, height=0.12, color=MESSAGE_COLOUR, lw=0)
            blocks = work[r] / block
            ax.text(end * 1e3 * 1.01, r, f"{blocks:g} block{'' if blocks == 1 else 's'}", va="center", fontsize=8)
        mean = sum(work.values()) / n
        measured = max(work.values()) / mean if mean else 0
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)], fontsize=8)
        ax.set_ylim(n - 0.4, -0.6)
        ax.set_xlim(0, end * 1e3 * 1.12)
        ax.set_title(f"{label}: busiest rank / mean = {measured:.2f} (the layout's {balance(n, run['layout'], True):.2f})",
                     fontsize=9)
    axes[-1].set_xlabel("ms since the forward began (boxes: matmuls, coloured by the ring's step; grey bars: a "
                        "receive, from posted to done)", fontsize=8)
    return fig


def attention_view(outcome) -> dict:
    """The timeline view of a q24 case: every message and all-to-all of each rank, each run named above them."""
    from lab_src.views.saved import case_view
    view = {**case_view(outcome), "title": f"q24: {outcome.case.label}; every message of each rank",
            "compute_free": "the matmuls are not drawn here: blocks_figure(report) draws them per rank"}
    return view
