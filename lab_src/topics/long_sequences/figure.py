"""Q23's picture: the bytes a block kept for its backward, per mode (none, selective, full), measured in the run beside
the student's prediction and the paper's figure, on a log scale (the plain block's bar is mostly its s^2 terms).

    kept_bars(measured, predicted, shape, dtype)      measured: {mode: bytes}; predicted: {mode: bytes} or {}
    paper_curves(h, a, b)                             the notebook's opening figure: the paper's count per mode
                                                      against the sequence length, beside one layer's weights
    pipeline_bars(rows)                               the study in the pipeline: per rank and mode, what a
                                                      micro-batch kept beside the closed form
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


def paper_curves(h: int = 4096, a: int = 32, b: int = 1):
    """The paper's bytes per layer for each mode (records.paper_bytes: 16-bit activations, 1-byte masks) against the
    sequence length s, on log scales, beside the layer's own weights in 16 bits (12 h^2 parameters): computed from
    the formula for a layer of a 7B-sized model, not measured; the student's own block is measured later."""
    from lab_src.views.static import TimelineFigure
    lengths = [2 ** k for k in range(9, 16)]
    fig = TimelineFigure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    labels = {"none": "none: 34 sbh + 5 as²b", "selective": "selective: 34 sbh", "full": "full: 2 sbh"}
    for mode, color in zip(MODES, ("#4c72b0", "#dd8452", "#55a868")):
        ax.plot(lengths, [paper_bytes(b, s, h, a, mode) for s in lengths], marker="o", ms=3, color=color,
                label=labels[mode])
    weights = 2 * 12 * h * h
    ax.axhline(weights, color="#555", lw=0.8, ls="--", label=f"the layer's weights, 16-bit: {weights / 2**20:.0f} MiB")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [f"{s:,}" for s in lengths], fontsize=8)
    ax.set_xlabel("sequence length s")
    ax.set_ylabel("bytes kept for the backward, one layer")
    ax.set_title(f"the paper's count, one layer of h = {h}, {a} heads, b = {b} (computed from the formula, "
                 f"not measured)", fontsize=9)
    ax.legend(fontsize=8, frameon=False)
    return fig


def pipeline_bars(rows: list):
    """q23's study in the pipeline (checks/recompute_study.py): per rank, the bytes one micro-batch kept in each
    mode (the run's: its peak over the micro-batches it held), with the closed form of its blocks marked, on a log
    scale. rows: [{"mode", "rank", "per_microbatch", "formula", ...}]."""
    from lab_src.views.static import TimelineFigure
    ranks = sorted({r["rank"] for r in rows})
    modes = [m for m in MODES if any(r["mode"] == m for r in rows)]
    fig = TimelineFigure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(len(modes), 1)
    colors = {"none": "#c44e52", "selective": "#dd8452", "full": "#4c72b0"}
    for i, mode in enumerate(modes):
        got = {r["rank"]: r for r in rows if r["mode"] == mode}
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(ranks))]
        ax.bar(xs, [got[r]["per_microbatch"] for r in ranks], width, color=colors.get(mode), edgecolor="black",
               linewidth=0.5, label=f"{mode}: your run")
        ax.scatter(xs, [got[r]["formula"] for r in ranks], marker="_", s=300, color="black", zorder=3,
                   label="closed form of its blocks" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks(range(len(ranks)), [f"rank {r}" for r in ranks])
    ax.set_ylabel("bytes a micro-batch keeps")
    ax.set_title("your 1F1B step with your recompute_block: per micro-batch in flight, each rank", fontsize=9)
    ax.legend(fontsize=7, frameon=False)
    return fig


def sp_bars(measured: dict, predicted: dict, shape: tuple, dtype: str):
    """q23's sequence-parallel run: the bytes each rank saved for its backward (measured: {rank: bytes}), beside the
    lab's closed forms per rank for one process, t-way tensor parallelism and sequence parallelism, and the
    student's prediction ({"tensor_parallel", "sequence_parallel"} or {}), on a log scale."""
    from lab_src.topics.long_sequences.records import ITEMSIZE, kept_bytes, sp_kept_bytes, tp_kept_bytes
    from lab_src.views.static import TimelineFigure
    b, s, h, a, t = shape
    e = ITEMSIZE[dtype]
    forms = {"one process (plain block)": kept_bytes(b, s, h, a, e, "none"),
             f"tensor parallel, t = {t}": tp_kept_bytes(b, s, h, a, e, t),
             f"sequence parallel, t = {t}": sp_kept_bytes(b, s, h, a, e, t)}
    fig = TimelineFigure(figsize=(8, 3.4), layout="constrained")
    ax = fig.subplots()
    ranks = sorted(measured)
    xs = list(range(len(ranks)))
    bars = ax.bar(xs, [measured[r] for r in ranks], 0.6, color="#4c72b0", edgecolor="black", linewidth=0.5,
                  label="your sp_block, measured")
    for bar, r in zip(bars, ranks):
        ax.annotate(f"{measured[r] / 2**20:.2f} MiB", (bar.get_x() + bar.get_width() / 2, measured[r]),
                    ha="center", va="bottom", fontsize=7)
    for (label, y), color, style in zip(forms.items(), ("#c44e52", "#dd8452", "#55a868"), ("--", "-.", ":")):
        ax.axhline(y, color=color, ls=style, lw=1.2, label=f"{label}: {y / 2**20:.2f} MiB")
    for key, marker in (("tensor_parallel", "v"), ("sequence_parallel", "^")):
        if predicted.get(key):
            ax.scatter([xs[-1] + 0.5], [predicted[key]], marker=marker, color="black", zorder=3,
                       label=f"your prediction, {key.replace('_', ' ')}")
    ax.set_yscale("log")
    ax.set_xticks(xs, [f"rank {r}" for r in ranks])
    ax.set_ylabel("bytes saved for the backward, per rank")
    ax.set_title(f"one block on t = {t} ranks, b={b} s={s} h={h} a={a}, {dtype}, dropout on", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="lower left")
    return fig
