"""Q23's picture: the bytes a block kept for its backward, per mode (none, selective, full), measured in the run beside
the student's prediction and the paper's figure, on a log scale (the plain block's bar is mostly its s^2 terms).

    kept_bars(measured, predicted, shape, dtype)      measured: {mode: bytes}; predicted: {mode: bytes} or {}
"""
from __future__ import annotations

from lab_src.topics.long_sequences.records import MODES, paper_bytes

COLORS = {"measured (your run)": "#4c72b0", "your prediction": "#dd8452", "the paper's (1-byte masks)": "#bbbbbb"}


def kept_bars(measured: dict, predicted: dict, shape: tuple, dtype: str):
    from lab_src.views.static import TimelineFigure
    b, s, h, a = shape
    paper = {m: paper_bytes(b, s, h, a, m) for m in MODES} if dtype == "bfloat16" else {}
    series = {"measured (your run)": measured, "your prediction": predicted, "the paper's (1-byte masks)": paper}
    fig = TimelineFigure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(series)
    for i, (label, values) in enumerate(series.items()):
        xs = [j + (i - 1) * width for j, m in enumerate(MODES) if values.get(m)]
        ys = [values[m] for m in MODES if values.get(m)]
        bars = ax.bar(xs, ys, width, label=label, color=COLORS[label], edgecolor="black", linewidth=0.5)
        for bar, y in zip(bars, ys):
            ax.annotate(f"{y / 2**20:.2f} MiB" if y >= 2**20 else f"{y / 2**10:.0f} KiB",
                        (bar.get_x() + bar.get_width() / 2, y), ha="center", va="bottom", fontsize=7)
    ax.set_yscale("log")
    ax.set_xticks(range(len(MODES)), ["none (plain block)", "selective (core recomputed)", "full (input only)"])
    ax.set_ylabel("bytes kept for the backward")
    ax.set_title(f"one block, b={b} s={s} h={h} a={a}, {dtype}, dropout on", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    return fig
