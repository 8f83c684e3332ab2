"""Q18's opening picture: the lab's whole block split over t ranks, drawn from the model's own shapes.

    tp_block_figure(t=2)

One row per rank, left to right: the LayerNorm (replicated: grey, the same on every rank), qkv with the
rows of this rank's heads shaded (q, k and v alike), the attention of its heads (its own dropout
stream: a different mask on every rank), proj with the columns of its heads shaded, then the first
all-reduce; the residual add (the shared dropout stream: the same mask on every rank), the second
LayerNorm, the MLP of q17 and the second all-reduce. The bars are the all-reduces, in the colour the
timeline gives them (views/prepare.py); the streams are named as pipeline/dropout.py names them.
"""
from __future__ import annotations

from lab_src.pipeline.config import LabConfig
from lab_src.topics.tensor_parallel.figure import RANK_COLORS


def tp_block_figure(t: int = 2, cfg: LabConfig = LabConfig(global_batch_size=4, num_microbatches=2),
                    streams: bool = True):
    """A matplotlib figure: who holds which heads and which features of the block on `t` ranks."""
    from matplotlib.patches import Rectangle

    from lab_src.views.prepare import COLORS
    from lab_src.views.static import TimelineFigure
    h, heads = cfg.hidden_size, cfg.num_heads
    per = heads // t
    fig = TimelineFigure(figsize=(13, 1.35 * t + 1.7), layout="constrained")
    ax = fig.subplots()
    row_h, gap = 1.0, 0.4
    top = t * (row_h + gap)
    grey, reduce_color = "#bdbdbd", COLORS["all_reduce"]

    def box(x, y, w, label, color, alpha=0.75, text_color="black"):
        ax.add_patch(Rectangle((x, y + 0.12), w, row_h - 0.24, fc=color, ec="#777", lw=0.7, alpha=alpha))
        ax.text(x + w / 2, y + row_h / 2, label, ha="center", va="center", fontsize=6.8, color=text_color)

    for r in range(t):
        y = top - (r + 1) * (row_h + gap)
        c = RANK_COLORS[r % len(RANK_COLORS)]
        ax.text(0.0, y + row_h / 2, f"rank {r}", fontsize=10, fontweight="bold", va="center", color=c)
        box(0.8, y, 0.9, "attn_norm\n(whole)", grey)
        box(1.85, y, 1.25, f"qkv: heads\n{r * per}..{(r + 1) * per - 1}\n({3 * h // t}, {h})", c)
        # streams=False: the figure above q18's prediction leaves the question it asks open
        own, shared = (f"own stream\n(shard {r})", "shared\nstream") if streams else ("which\nstream?", "which\nstream?")
        box(3.25, y, 1.45, f"attention of\nheads {r * per}..{(r + 1) * per - 1}\ndropout: {own}", c, 0.45)
        box(4.85, y, 1.1, f"proj cols\n({h}, {h // t})", c)
        box(6.35, y, 1.2, f"+ residual\ndropout: {shared}", grey)
        box(7.7, y, 0.9, "mlp_norm\n(whole)", grey)
        box(8.75, y, 1.45, f"MLP (q17)\nup ({4 * h // t}, {h})\ndown ({h}, {4 * h // t})", c)
        box(10.6, y, 1.2, f"+ residual\ndropout: {shared}", grey)
    for x, label in ((1.77, "f"), (6.1, "g"), (8.67, "f"), (10.35, "g")):
        ax.add_patch(Rectangle((x - 0.07, 0.0), 0.14, top - gap + 0.1, fc=reduce_color, alpha=0.85))
        ax.text(x, top - gap + 0.2, label, ha="center", va="bottom", fontsize=9, color="#0b6f7a", fontweight="bold")
    ax.text(0.8, -0.35, "grey: replicated, identical on every rank (same weights, same masks); coloured: this rank's "
                        "shard (its heads, its features, its own masks). f: identity forward, all-reduce backward; "
                        "g: all-reduce forward, identity backward", fontsize=7.5, va="top")
    ax.set_xlim(-0.1, 12.0)
    ax.set_ylim(-0.8, top + 0.6)
    ax.axis("off")
    fig.suptitle(f"The whole block on t = {t} ranks: {heads} heads, {per} per rank; two all-reduces each way "
                 f"(after proj and after the MLP's down forward, before qkv and up backward)",
                 fontsize=10, x=0.01, ha="left")
    return fig
