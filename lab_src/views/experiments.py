"""Figures of Q12's experiments (lab_src/checks/experiments.py): memory and bubble against m.

    memory_figure(runs)    peak activation memory per rank against m: AFAB and 1F1B side by side, same scale
    bubble_figure(runs)    measured bubble against (p-1)/(m+p-1), m = 1 marked as naive model parallelism
"""
from __future__ import annotations

from lab_src.pipeline.schedules import schedule
from lab_src.views.bubble import theoretical_bubble
from lab_src.views.memory import RANK_COLORS
from lab_src.views.static import TimelineFigure


def memory_figure(runs) -> TimelineFigure:
    names = [s for s in ("afab", "1f1b") if runs.of(s)]
    fig = TimelineFigure(figsize=(11, 4), layout="constrained")
    axes = fig.subplots(1, max(len(names), 1), squeeze=False, sharey=True)[0]
    for ax, name in zip(axes, names):
        rows = sorted(runs.of(name), key=lambda row: row["m"])
        ms = [row["m"] for row in rows]
        for r in rows[0]["peak"]:
            ax.plot(ms, [row["peak"][r] / 2**20 for row in rows], marker="o", ms=4, lw=1.6,
                    color=RANK_COLORS[r % len(RANK_COLORS)], label=f"rank {r}")
        ax.set_xticks(ms, [str(m) for m in ms])     # a linear axis: AFAB's line is straight, 1F1B's flat
        ax.set_xlim(0, ms[-1] * 1.05)
        ax.set_ylim(bottom=0)
        ax.set_xlabel("micro-batches m")
        held = " / ".join(str(rows[-1]["held"][r]) for r in rows[-1]["held"])
        ax.set_title(f"{schedule(name).title}\nmicro-batches held at m = {ms[-1]}: {held}", fontsize=10)
        ax.grid(color="#e4e4e4", lw=0.6)
        ax.legend(fontsize=8, frameon=False)
    axes[0].set_ylabel("peak activation memory (MiB,\nsaved for backward)")
    fig.suptitle("Your steps on 4 stages: what each rank holds for its backwards", fontsize=12, x=0.01, ha="left")
    return fig


def bubble_figure(runs) -> TimelineFigure:
    cfg = runs.config
    p = cfg.num_stages
    rows = sorted(runs.rows, key=lambda row: row["m"])
    ms = [row["m"] for row in rows]
    fig = TimelineFigure(figsize=(10, 4.2), layout="constrained")
    ax = fig.subplots()
    dense = [m / 4 for m in range(4, 4 * max(ms + [1]) + 1)]
    ax.plot(dense, [theoretical_bubble(p, m) for m in dense], color="#888", lw=1.4, label="theory (p-1)/(m+p-1)")
    ax.plot(ms, [row["bubble"] for row in rows], marker="o", color="#e45756", lw=1.6, label="measured (wall clock)")
    if any(row.get("emulated") is not None for row in rows):
        ax.plot(ms, [row.get("emulated") for row in rows], marker="s", color="#4c78a8", lw=1.6,
                label="emulated compute (your run's order)")
    for row in rows:
        if row["m"] == 1:
            ax.annotate("m = 1: naive model parallelism\n(one stage works at a time)", (1, row["bubble"]),
                        xytext=(30, 6), textcoords="offset points", fontsize=8.5,
                        arrowprops=dict(arrowstyle="-", color="#888"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(ms, [str(m) for m in ms])
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_xlabel("micro-batches m")
    ax.set_ylabel("bubble (idle share of the step)")
    ax.set_title(f"Bubble of your {schedule(rows[0]['schedule']).title if rows else ''} step, {p} stages\n"
                 f"DEMO model: hidden {cfg.hidden_size}, sequence {cfg.seq_len}, batch {cfg.global_batch_size} "
                 f"(micro-batches of {cfg.global_batch_size // ms[-1] if ms else '?'} to {cfg.global_batch_size} samples)",
                 fontsize=10, loc="left")
    ax.grid(color="#e4e4e4", lw=0.6)
    ax.legend(frameon=False)
    return fig
