"""Q21's opening picture: what each of n data-parallel ranks holds of the training state (parameters, gradients,
AdamW's two moments) under plain data parallelism and the three ZeRO stages, drawn from the sizes alone.

    zero_figure(n=4)               # q21's notebook, after the check: every stage
    zero_figure(n=4, stages=1)     # its opening: plain data parallelism alone (the ZeRO rows answer its prediction)

One row per stage of sharding, one block per rank; in each block the parameters, the gradients and the optimizer
state, each either whole (the full width of its band) or a shard (1/n of it, at the rank's place).
"""
from __future__ import annotations

COLORS = {"parameters": "#4c72b0", "gradients": "#dd8452", "AdamW moments (2x)": "#55a868"}
STAGES = (("data parallel", ()), ("ZeRO-1: moments sharded", ("AdamW moments (2x)",)),
          ("ZeRO-2: + gradients", ("AdamW moments (2x)", "gradients")),
          ("ZeRO-3 (FSDP): + parameters", ("AdamW moments (2x)", "gradients", "parameters")))
WIDTH = {"parameters": 1.0, "gradients": 1.0, "AdamW moments (2x)": 2.0}    # in units of the parameters' bytes


def zero_figure(n: int = 4, stages: int | None = None):
    """What each of n ranks holds under the first `stages` rows of STAGES (all of them by default)."""
    from matplotlib.patches import Patch, Rectangle

    from lab_src.views.static import TimelineFigure
    rows = STAGES[:stages] if stages else STAGES
    fig = TimelineFigure(figsize=(11, 0.9 * len(rows) + 1.2), layout="constrained")
    ax = fig.subplots()
    gap = 0.6
    block = sum(WIDTH.values()) + gap
    for row, (title, sharded) in enumerate(rows):
        y = len(rows) - 1 - row
        for r in range(n):
            x = r * block
            for kind, w in WIDTH.items():
                ax.add_patch(Rectangle((x, y + 0.1), w, 0.7, fc="white", ec="#bbb", lw=0.6))
                if kind in sharded:
                    ax.add_patch(Rectangle((x + w * r / n, y + 0.1), w / n, 0.7, fc=COLORS[kind], ec="black", lw=0.6))
                else:
                    ax.add_patch(Rectangle((x, y + 0.1), w, 0.7, fc=COLORS[kind], ec="black", lw=0.6))
                x += w
    ax.set_xlim(-0.1, n * block)
    ax.set_ylim(0, len(rows))
    ax.set_yticks([len(rows) - 1 - i + 0.45 for i in range(len(rows))], [t for t, _ in rows], fontsize=8)
    ax.set_xticks([r * block + (block - gap) / 2 for r in range(n)], [f"rank {r}" for r in range(n)], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper center",
              bbox_to_anchor=(0.4, -0.32 / len(rows)), ncol=3, fontsize=8, frameon=False)
    said = (f"a coloured band whole, or its 1/{n} shard at the rank's place" if len(rows) > 1 else
            "every band whole, on every rank")
    fig.suptitle(f"What each of {n} data-parallel ranks holds of the training state (float32, AdamW): {said}",
                 fontsize=9)
    return fig


def fsdp_figure(layers: int = 4, n: int = 4):
    """FSDP's rhythm on one rank of a stage of `layers` equal layers, for one micro-batch: the bytes of the layers'
    parameters it holds over time (the shards at rest; one layer's gathered copy while that layer runs, forward
    then backward, the backward twice as long), in units of one layer's bytes."""
    from matplotlib.patches import Rectangle

    from lab_src.views.static import TimelineFigure
    fig = TimelineFigure(figsize=(11, 3.0), layout="constrained")
    ax = fig.subplots()
    rest = layers / n
    t, xs, ys = 0.0, [0.0], [rest]
    phases = [("F", i, 1.0) for i in range(layers)] + [("B", i, 2.0) for i in reversed(range(layers))]
    for kind, i, length in phases:
        gather = 0.25                                   # the all-gather before the layer runs
        xs += [t, t + gather + length, t + gather + length]
        ys += [rest + 1, rest + 1, rest]
        ax.add_patch(Rectangle(
            (t, -0.55), gather, 0.35, fc="#8172b3", ec="none"))
        ax.add_patch(Rectangle(
            (t + gather, -0.55), length, 0.35, fc="#4c72b0" if kind == "F" else "#dd8452", ec="black", lw=0.5))
        ax.text(t + gather + length / 2, -0.375, f"{kind}{i}", ha="center", va="center", fontsize=7, color="white")
        if kind == "B":
            ax.add_patch(Rectangle(
                (t + gather + length, -0.55), 0.2, 0.35, fc="#c44e52", ec="none"))
            length += 0.2
        t += gather + length
    xs.append(t)
    ys.append(rest)
    ax.step(xs, ys, where="post", color="black", lw=1.4)
    ax.fill_between(xs, 0, ys, step="post", color="#4c72b0", alpha=0.15)
    ax.axhline(rest, color="#555", lw=0.8, ls="--")
    ax.text(t + 0.1, rest, f"at rest: {layers} shards of 1/{n}", va="center", fontsize=8)
    ax.text(t + 0.1, rest + 1, "+ one layer gathered", va="center", fontsize=8)
    ax.set_xlim(0, t + 3.2)
    ax.set_ylim(-0.7, rest + 1.6)
    ax.set_yticks([0, rest, rest + 1], ["0", f"{rest:g}", f"{rest + 1:g}"], fontsize=8)
    ax.set_ylabel("layers' bytes held", fontsize=8)
    ax.set_xticks([])
    ax.set_xlabel("time (a model: a gather a quarter of a forward, a backward twice a forward); purple: all-gather, "
                  "red: reduce-scatter", fontsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.suptitle(f"FSDP on one rank of a stage of {layers} layers sharded over {n} ranks, one micro-batch: gather, "
                 f"run, free; the backward gathers again and reduce-scatters", fontsize=9)
    return fig
