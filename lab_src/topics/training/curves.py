"""Learning curves (exercise q13): the pipeline's loss and the single process's, step by step, on one
figure, with their relative difference below and the held-out results in the title.

    fig = curves_figure(pipeline_losses, single_losses, tolerance=1e-5,
                        held_out={"pipeline": (0.93, 0.25), "single process": (0.93, 0.25)})
    fig.savefig("curves.png")          # in a notebook the figure shows itself
"""
from __future__ import annotations

from lab_src.views.static import TimelineFigure as PngFigure

PIPELINE = "#1f77b4"
SINGLE = "#ff7f0e"


def curves_figure(pipeline: list[float], single: list[float], *, tolerance: float | None = None,
                  held_out: dict[str, tuple[float, float]] | None = None, title: str = "",
                  smooth: int = 0, mistaken: bool = False) -> PngFigure:
    """Both loss curves overlaid (the pipeline's as dots, the single process's as a line), and the relative
    difference per step on a log scale with the tolerance. `held_out` maps a run's name to its (accuracy,
    loss) on the held-out images. With `smooth` > 1, a running mean over that many steps is drawn too.
    `mistaken`: a check found the curves apart because of a mistake; the caption then says so instead of
    blaming rounding (which parts two correct runs only after many steps)."""
    n = min(len(pipeline), len(single))
    steps = list(range(n))
    fig = PngFigure(figsize=(9, 5.6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.3])
    marker = "o" if n <= 120 else None
    top.plot(steps, single[:n], color=SINGLE, lw=2.2, alpha=0.8, label="single process (whole model)")
    top.plot(steps, pipeline[:n], color=PIPELINE, lw=0.9 if marker else 1.0, ls="--" if marker else "-",
             marker=marker, ms=3.5, label=f"pipeline ({'dots' if marker else 'thin line'})")
    if smooth > 1 and n > smooth:
        for run, color, style in ((single, "black", "-"), (pipeline, "#08306b", "--")):
            avg = [sum(run[i - smooth + 1:i + 1]) / smooth for i in range(smooth - 1, n)]
            name = "single process" if run is single else "pipeline"
            top.plot(range(smooth - 1, n), avg, color=color, lw=1.3, ls=style, label=f"{name}, mean of {smooth} steps")
    top.set_ylabel("training loss (cross-entropy)")
    top.grid(color="#e4e4e4", lw=0.6)
    top.legend(fontsize=8.5, frameon=False)
    diffs = [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(pipeline[:n], single[:n])]
    shown = [max(d, 1e-12) for d in diffs]
    bottom.semilogy(steps, shown, color=PIPELINE, lw=0.9, marker=marker, ms=2.5)
    if tolerance:
        bottom.axhline(tolerance, color="#d62728", lw=1, ls=":", label=f"tolerance {tolerance:.0e}")
        bottom.legend(fontsize=8, frameon=False, loc="upper left")
    bottom.set_ylabel("|pipeline - single|\n/ single")
    if any(d == 0 for d in diffs):
        bottom.text(0.99, 0.04, "at the bottom: equal to the last bit", transform=bottom.transAxes, ha="right",
                    fontsize=7.5, color="#555")
    bottom.set_xlabel("optimizer step")
    bottom.grid(color="#e4e4e4", lw=0.6)
    bottom.set_ylim(1e-12, max(1.0, max(shown) * 3))
    lines = [title] if title else []
    if diffs:
        apart = next((k for k, d in enumerate(diffs) if tolerance and d > tolerance), None)
        if apart is None:
            lines.append(f"largest relative difference over {n} steps: {max(diffs):.1e}")
        elif mistaken:
            lines.append((f"within {tolerance:.0e} of each other up to step {apart - 1}; " if apart else "")
                         + f"apart from step {apart} on by more than rounding: the check found a mistake "
                           f"(its verdict says which)")
        else:
            lines.append(f"within {tolerance:.0e} of each other up to step {apart - 1}; from there the rounding "
                         f"differences (~1e-7 at first),\ngrown through training, send each run its own way "
                         f"(float32 sums in another order)")
    if held_out:
        lines.append("held out: " + " · ".join(f"{k} accuracy {acc:.1%}, loss {loss:.3f}"
                                              for k, (acc, loss) in held_out.items()))
    if lines:      # wrapped to the figure's width (9 in at 9.5 pt): a longer line was clipped mid-word
        import textwrap
        top.set_title("\n".join(textwrap.fill(part, 105) for line in lines for part in line.split("\n")),
                      fontsize=9.5, loc="left")
    return fig
