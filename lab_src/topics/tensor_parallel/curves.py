"""Q18's learning curves: tensor-parallel training runs against one process's curve.

    curves_figure(runs, title)

`runs`: [{"label", "single": [loss per step], "curves": {rank: [loss per step]}}]. Left, the losses (one
process's in black, each run's reporting ranks in colour); right, each run's relative difference from one
process per step, on a log axis, with q13's tolerance (1e-5, float32) drawn across: a right seed policy
stays at float32's rounding (about 1e-7), a wrong one leaves it from the first step on.
"""
from __future__ import annotations

from lab_src.topics.training.records import CURVE_RTOL, relative_differences

COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#72b7b2")


def curves_figure(runs: list[dict], title: str = ""):
    from lab_src.views.static import TimelineFigure
    fig = TimelineFigure(figsize=(12, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    drawn_single = False
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        if not drawn_single:
            left.plot(run["single"], color="black", lw=2.5, alpha=0.4, label="one process")
            drawn_single = True
        for k, (rank, curve) in enumerate(sorted(run["curves"].items())):
            left.plot(curve, color=color, lw=1, ls="-" if k == 0 else "--",
                      label=f"{run['label']}, rank {rank}" if k < 2 else None)
            diffs = [max(d, 1e-10) for d in relative_differences(curve, run["single"])]
            right.semilogy(diffs, color=color, lw=1, ls="-" if k == 0 else "--",
                           label=f"{run['label']}, rank {rank}" if k < 2 else None)
    right.axhline(CURVE_RTOL["float32"], color="#d62728", lw=1, ls=":", label="tolerance (q13): 1e-5")
    left.set_xlabel("step")
    left.set_ylabel("training loss")
    right.set_xlabel("step")
    right.set_ylabel("|loss - one process's| / one process's")
    left.legend(fontsize=7)
    right.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    return fig
