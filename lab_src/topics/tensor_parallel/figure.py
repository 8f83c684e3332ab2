"""Q17's opening picture: the block's MLP split over t ranks, drawn from the lab's own model.

    tp_figure(t=2)

One row per rank: the input (the same on every rank), `up`'s weight with the rows (output features) this
rank holds shaded, the activation slice it computes, `down`'s weight with the columns (input features) it
holds shaded, its partial sum; then the two communication rounds as bars across every rank, in the colour
the timeline gives an all-reduce (views/prepare.py): f before `up` (identity forward,
all-reduce of the input's gradient backward) and g after `down` (all-reduce forward, identity backward).
The shapes come from the model (pipeline/model.py) and the case's batch (topics/tensor_parallel/runtime.py).
"""
from __future__ import annotations

from lab_src.pipeline.config import LabConfig

RANK_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#eeca3b", "#9d755d")


def tp_figure(t: int = 2, cfg: LabConfig = LabConfig(global_batch_size=4, num_microbatches=2)):
    """A matplotlib figure: who holds what of the MLP on `t` ranks, and where the two rounds are."""
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from lab_src.topics.tensor_parallel.runtime import batch_shape, full_mlp
    from lab_src.views.prepare import COLORS
    from lab_src.views.static import TimelineFigure
    up, down = full_mlp(cfg)
    (four_h, h), (b, s, _) = tuple(up.weight.shape), batch_shape(cfg)
    k = four_h // t
    fig = TimelineFigure(figsize=(12, 1.45 * t + 1.6), layout="constrained")
    ax = fig.subplots()
    row_h, gap = 1.0, 0.45
    reduce_color = COLORS["all_reduce"]

    def arrow(x0, x1, y):
        ax.add_patch(FancyArrowPatch((x0, y), (x1, y), arrowstyle="-|>", mutation_scale=10, color="#555"))

    def matrix(x, y, w, hgt, band, along_rows, color, label):
        """A weight matrix drawn w x hgt, with band `band` of t shaded (rows or columns)."""
        ax.add_patch(Rectangle((x, y), w, hgt, fc="#f4f4f4", ec="#888", lw=0.8))
        if along_rows:
            ax.add_patch(Rectangle((x, y + hgt - (band + 1) * hgt / t), w, hgt / t, fc=color, alpha=0.75))
        else:
            ax.add_patch(Rectangle((x + band * w / t, y), w / t, hgt, fc=color, alpha=0.75))
        ax.text(x + w / 2, y - 0.13, label, ha="center", va="top", fontsize=7)

    top = t * (row_h + gap)
    for r in range(t):
        y = top - (r + 1) * (row_h + gap)
        mid = y + row_h / 2
        c = RANK_COLORS[r % len(RANK_COLORS)]
        ax.text(0.0, mid, f"rank {r}", fontsize=10, fontweight="bold", va="center", color=c)
        ax.text(0.75, mid, f"x\n{(b, s, h)}", fontsize=7.5, va="center", ha="left")
        arrow(1.6, 2.35, mid)
        matrix(2.5, y + 0.05, 0.55, row_h - 0.1, r, True, c,
               f"up.weight rows {r * k}..{(r + 1) * k - 1}\n({k}, {h}) + bias ({k},)")
        arrow(3.15, 3.9, mid)
        ax.text(4.0, mid, f"gelu → slice\n{(b, s, k)}", fontsize=7.5, va="center")
        arrow(5.05, 5.7, mid)
        matrix(5.8, y + 0.2, 1.1, row_h - 0.4, r, False, c,
               f"down.weight cols {r * k}..{(r + 1) * k - 1}\n({h}, {k})")
        arrow(7.0, 7.6, mid)
        ax.text(7.7, mid, f"partial sum\n{(b, s, h)}", fontsize=7.5, va="center")
        arrow(8.85, 9.45, mid)
        ax.text(9.95, mid, f"+ bias ({h},), once\n→ output {(b, s, h)}\non every rank", fontsize=7.5, va="center")
    for x, name, what in ((1.95, "f", "forward: identity\nbackward: all-reduce\nof the input's gradient"),
                          (9.15, "g", "forward: all-reduce\nof the partial sums\nbackward: identity")):
        ax.add_patch(Rectangle((x - 0.09, 0.05), 0.18, top - gap - 0.1 + 0.3, fc=reduce_color, alpha=0.85))
        ax.text(x, top + 0.05, f"{name}: {what}", ha="center", va="bottom", fontsize=7.5, color="#0b6f7a")
    ax.set_xlim(-0.1, 11.6)
    ax.set_ylim(-0.55, top + 1.15)
    ax.axis("off")
    fig.suptitle(f"The block's MLP, down(gelu(up(x))), on t = {t} ranks: each rank holds 1/{t} of both weights "
                 f"(shaded); the two bars are the only communication, one all-reduce each way",
                 fontsize=10, x=0.01, ha="left")
    return fig
