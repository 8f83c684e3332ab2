"""Q27's pictures, drawn from the sizes alone or from a run: the n old shards of a flat state against the m new ones
(torch.tensor_split's), and the slices each new rank reads from the old ranks' files.

    reshard_figure(total=1_000_000, old=4, new=3)            # the opening: which old files each new rank opens
    reshard_figure(..., reads={j: bytes}, element=4)           # after the check: what each new rank read, measured

One row per old rank (its shard, one file) and one per new rank (its shard); under each new rank, the slices it
takes from each old file, coloured by the old rank they come from.
"""
from __future__ import annotations

from lab_src.topics.checkpoint.records import TENSORS, overlaps, shard_bounds, slice_bytes, whole_files_bytes

COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def reshard_figure(total: int = 1_000_000, old: int = 4, new: int = 3, reads: dict | None = None, element: int = 4,
                   title: str = "", slices: bool = True):
    """The old shards of `old` ranks against the new shards of `new` ranks over a flat vector of `total` elements;
    `slices`: each new shard's slices coloured by the old file they come from, and the files counted (the opening
    figure leaves them out: they answer its prediction); with `reads` ({new rank: bytes its process read}), each new
    rank's bytes read beside its slices' and whole files'."""
    from matplotlib.patches import Rectangle

    from lab_src.views.static import TimelineFigure
    rows = old + new
    fig = TimelineFigure(figsize=(11, 0.42 * rows + 1.5), layout="constrained")
    ax = fig.subplots()
    labels = []
    for i in range(old):
        y = rows - 1 - i
        a, b = shard_bounds(total, old, i)
        ax.add_patch(Rectangle((a, y + 0.15), b - a, 0.7, fc=COLORS[i % len(COLORS)], ec="black", lw=0.6))
        ax.text((a + b) / 2, y + 0.5, f"{b - a:,}", ha="center", va="center", fontsize=7, color="white")
        labels.append((y, f"old rank {i}: file {i}"))
    for j in range(new):
        y = new - 1 - j
        a, b = shard_bounds(total, new, j)
        ax.add_patch(Rectangle((a, y + 0.1), b - a, 0.8, fc="white", ec="black", lw=0.8))
        ax.text((a + b) / 2, y + 0.5, f"{b - a:,}", ha="center", va="center", fontsize=7,
                color="white" if slices else "black", zorder=3)
        for i, lo, hi in overlaps(total, old, new, j) if slices else ():
            ax.add_patch(Rectangle((lo, y + 0.3), hi - lo, 0.4, fc=COLORS[i % len(COLORS)], ec="none", alpha=0.85))
        files = len(overlaps(total, old, new, j))
        said = f"new rank {j}: {files} file{'s' if files > 1 else ''}" if slices else f"new rank {j}"
        if reads is not None and j in reads:
            need = slice_bytes(total, new, j, element)
            whole = whole_files_bytes(total, old, new, j, element)
            ax.text(total * 1.01, y + 0.5, f"read {reads[j]:,} B\nslices {need:,} B, whole files {whole:,} B",
                    va="center", fontsize=7)
        labels.append((y, said))
    ax.axhline(new + 0.0, color="#999", lw=0.6, ls="--")
    ax.set_xlim(0, total * (1.32 if reads else 1.0))
    ax.set_ylim(0, rows)
    ax.set_yticks([y + 0.5 for y, _ in labels], [t for _, t in labels], fontsize=8)
    ax.set_xlabel(f"element of the flat vector (N = {total:,}; each of the {len(TENSORS)} tensors "
                  f"({', '.join(TENSORS)}) is cut alike)", fontsize=8)
    ax.tick_params(labelsize=7)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.suptitle(title or f"A state saved on {old} ranks, loaded on {new}: the old shards (files) above, the new "
                          f"shards below" + (", coloured by the file each slice comes from" if slices else
                                             " (elements per shard written in each)"), fontsize=9)
    return fig
