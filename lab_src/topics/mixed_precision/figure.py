"""The opening picture of q26: one block's step on one rank, each tensor and operation as a box coloured by the dtype
it is in (float32, the compute dtype), from the contract alone (no bytes: the prediction asks for them)."""
from __future__ import annotations

COLOURS = {"float32": "#4c72b0", "compute": "#dd8452", "cast": "#8c8c8c"}
# (row, label, dtype) of each step, left to right; rows: 0 master and optimizer, 1 what travels, 2 compute
FLOW = [
    (0, "shard\n(master)", "float32"), (1, "cast", "cast"), (1, "all-gather", "compute"),
    (2, "forward", "compute"), (1, "all-gather\nagain", "compute"), (2, "backward", "compute"),
    (1, "cast", "cast"), (1, "reduce-\nscatter", "float32"), (0, "/ n, unscale", "float32"),
    (0, "SGD step", "float32"),
]
ROWS = ["the rank's shard:\nmaster, optimizer", "what travels", "what computes"]


def dtype_figure(compute: str = "bfloat16"):
    from matplotlib.patches import FancyBboxPatch

    from lab_src.views.static import TimelineFigure
    fig = TimelineFigure(figsize=(11, 2.8), layout="constrained")
    ax = fig.subplots()
    width, gap = 1.0, 0.25
    prev = None
    for i, (row, label, kind) in enumerate(FLOW):
        x, y = i * (width + gap), 2 - row
        ax.add_patch(FancyBboxPatch((x, y - 0.3), width, 0.6, boxstyle="round,pad=0.02", fc=COLOURS[kind],
                                    ec="black", lw=0.5))
        ax.text(x + width / 2, y, label, ha="center", va="center", fontsize=7.5,
                color="white" if kind != "cast" else "black")
        if prev is not None:
            ax.annotate("", xy=(x, y), xytext=(prev[0] + width, prev[1]),
                        arrowprops=dict(arrowstyle="->", lw=0.8, color="#444"))
        prev = (x, y)
    ax.set_xlim(-0.2, len(FLOW) * (width + gap))
    ax.set_ylim(-0.6, 2.6)
    ax.set_yticks([2, 1, 0], ROWS, fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    handles = [FancyBboxPatch((0, 0), 1, 1, fc=COLOURS[k]) for k in ("float32", "compute", "cast")]
    ax.legend(handles, ["float32", compute + " (the compute dtype)", "a cast"], fontsize=7.5, loc="upper right",
              bbox_to_anchor=(1.0, 1.25), ncol=3, frameon=False)
    fig.suptitle(f"One block's step on one rank: the master stays float32; the gathers and the block run in {compute}; "
                 f"the gradient is cast back and reduced in float32", fontsize=9)
    return fig


def mixed_view(outcome) -> dict:
    """The timeline of a q26 case (the kind's declared view): each rank's forward and backward per step, and under
    them the gathers, reduce-scatters and the ring's messages the answer's module and scaler asked for; no pipeline
    schedule to hold it to."""
    from lab_src.views.saved import case_view
    return {**case_view(outcome), "title": f"q26: {outcome.case.label}",
            "compute_free": "no schedule: one forward and one backward a step on every rank"}
