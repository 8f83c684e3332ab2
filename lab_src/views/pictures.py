"""Pictures for the notebooks, drawn from the lab's own code so that they cannot disagree with the checks.

    schedule_figure("afab", p=4, m=4)   # Q7: a schedule's step, by the timeline renderer (views/ideal.py)
    seeds_figure(report)                # Q1: which ranks drew the same weights and data (the seeds demo)
    boundaries_figure(cfg, shape)       # Q3: what crosses each boundary between stages, in each direction

Each returns a matplotlib figure that shows itself in a notebook (and in nbgrader's feedback).
"""
from __future__ import annotations

from lab_src.pipeline.config import LabConfig


def schedule_figure(schedule: str = "afab", p: int = 4, m: int = 4):
    """One step of `schedule` as the schedule alone implies it (schedules.py), drawn by the timeline's
    own renderer: every stage takes the same time per micro-batch (a backward twice a forward), and a
    message a small fraction of that."""
    from lab_src.pipeline.schedules import schedule as lookup
    from lab_src.views.ideal import CostModel, ideal_events
    from lab_src.views.prepare import prepare
    from lab_src.views.static import figure
    cost = CostModel(forward_s_per_layer=1e-3, backward_s_per_layer=2e-3, latency_s=0.05e-3)
    events = ideal_events(p, m, cost, schedule=schedule, activation_bytes=0)
    tl = prepare(events, p, m, kind="ideal", align=False,
                 note="forward 1 ms, backward 2 ms per stage and micro-batch, messages 0.05 ms")
    return figure([tl], f"{lookup(schedule).title}: {p} stages, {m} micro-batches")


def seeds_figure(report):
    """Q1's demo as a picture: for each way of drawing random numbers, one box per rank, coloured by
    what the rank drew (the same colour: the same numbers), with the first of them written in."""
    from matplotlib.patches import Rectangle

    from lab_src.views.static import TimelineFigure
    rows = [("same_seed", "weights, manual_seed(seed)"), ("rank_seed", "weights, manual_seed(seed + rank)"),
            ("block3", "block 3, seeded by its own name"), ("data_same", "data, shuffled with manual_seed(seed)"),
            ("data_split", "data, one shuffle, each rank its slice")]
    obs = {r: o for r, o in sorted(report.observations().items()) if "same_seed" in o}
    if not obs:
        print("Nothing to draw: the demo did not run here.")
        return None
    ranks = list(obs)
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]
    fig = TimelineFigure(figsize=(2.2 + 1.55 * len(ranks), 0.6 + 0.55 * len(rows)), layout="constrained")
    ax = fig.subplots()
    for y, (key, label) in enumerate(rows):
        seen: dict[tuple, int] = {}
        for x, r in enumerate(ranks):
            value = tuple(obs[r].get(key) or ())
            colour = palette[seen.setdefault(value, len(seen)) % len(palette)]
            ax.add_patch(Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, color=colour, alpha=0.85))
            ax.text(x + 0.5, y + 0.5, ", ".join(f"{v:g}" for v in value[:2]), ha="center", va="center",
                    color="white", fontsize=8)
        same = "all the same" if len(seen) == 1 else ("all different" if len(seen) == len(ranks) else
                                                      f"{len(seen)} different")
        ax.text(-0.1, y + 0.5, f"{label}\n({same})", ha="right", va="center", fontsize=8.5)
    ax.set_xlim(-0.05, len(ranks))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([x + 0.5 for x in range(len(ranks))], [f"rank {r}" for r in ranks])
    ax.xaxis.tick_top()
    ax.set_yticks([])
    for side in ("left", "right", "bottom", "top"):
        ax.spines[side].set_visible(False)
    fig.suptitle("What each rank drew: one colour per distinct draw", fontsize=10, x=0.01, ha="left")
    return fig


def boundaries_figure(cfg: LabConfig = LabConfig(), shape=None):
    """The pipeline's stages in a row and what crosses each boundary: forward, the activation of a
    micro-batch; backward, its gradient. The tokens that enter stage 0 and the logits the last stage
    computes come from running the lab's own model on a micro-batch; the tensor between stages is
    `shape` (your answer to Q3), or a question mark."""
    import torch
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    from lab_src.views.static import TimelineFigure
    mbs = cfg.global_batch_size // cfg.num_microbatches
    tokens = next(iter(make_dataloader(cfg, mbs)))
    with torch.no_grad():
        logits = build_model(cfg)(tokens)
    p = cfg.num_stages
    crossing = "?" if shape is None else str(tuple(int(s) for s in shape))
    fig = TimelineFigure(figsize=(2.4 * p + 2.4, 2.9), layout="constrained")
    ax = fig.subplots()
    width, gap = 1.5, 0.9
    for r in range(p):
        x = 1.2 + r * (width + gap)
        parts = (["embed"] if r == 0 else []) + ["its blocks"] + (["head"] if r == p - 1 else [])
        ax.add_patch(FancyBboxPatch((x, 0.9), width, 1.2, boxstyle="round,pad=0.05", fc="#e8eef6", ec="#4c78a8"))
        ax.text(x + width / 2, 1.75, f"stage {r}", ha="center", fontsize=10, fontweight="bold")
        ax.text(x + width / 2, 1.3, " + ".join(parts), ha="center", fontsize=8)
        if r < p - 1:
            x0, x1 = x + width + 0.05, x + width + gap - 0.05
            ax.add_patch(FancyArrowPatch((x0, 1.85), (x1, 1.85), arrowstyle="-|>", mutation_scale=12, color="#4c78a8"))
            ax.add_patch(FancyArrowPatch((x1, 1.15), (x0, 1.15), arrowstyle="-|>", mutation_scale=12, color="#f58518"))
            ax.text((x0 + x1) / 2, 2.25, f"activation\n{crossing}", ha="center", fontsize=8, color="#4c78a8")
            ax.text((x0 + x1) / 2, 0.45, f"its gradient\n{crossing}", ha="center", fontsize=8, color="#f58518")
    ax.add_patch(FancyArrowPatch((0.1, 1.5), (1.15, 1.5), arrowstyle="-|>", mutation_scale=12, color="#555"))
    ax.text(0.05, 2.0, f"token ids\n{tuple(tokens.shape)}, {str(tokens.dtype).replace('torch.', '')}",
            fontsize=8, color="#555")
    end = 1.2 + (p - 1) * (width + gap) + width
    ax.add_patch(FancyArrowPatch((end + 0.05, 1.5), (end + 1.0, 1.5), arrowstyle="-|>", mutation_scale=12,
                                 color="#555"))
    ax.text(end + 0.1, 2.0, f"logits\n{tuple(logits.shape)}", fontsize=8, color="#555")
    ax.text(end + 0.1, 0.9, "stay on the\nlast stage", fontsize=7.5, color="#555")
    ax.set_xlim(0, end + 1.6)
    ax.set_ylim(0.2, 2.75)
    ax.axis("off")
    fig.suptitle(f"One micro-batch of {mbs} samples through {p} stages: forward (blue) and backward (orange)",
                 fontsize=10, x=0.01, ha="left")
    return fig
