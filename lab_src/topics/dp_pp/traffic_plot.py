"""The what-if plot of q14: predicted communication time per step, by kind, as the grid grows.

Left: against the number of data-parallel replicas, each replica running the measured pipeline on the
same micro-batches (the global batch grows with the replicas). The pipeline's messages stay put, the
data-parallel all-reduce grows with the ring and jumps where the ring leaves a node. Right: against the
number of micro-batches a replica's batch is cut into (its batch fixed): more, smaller messages, each
paying the latency again, while the all-reduce does not change. Where the lines cross, one kind of
traffic becomes the cheaper one.
"""
from __future__ import annotations

from lab_src.topics.dp_pp.network import Cluster, plan, predict
from lab_src.topics.dp_pp.traffic import TRAFFIC_KINDS

STYLE = {"pipeline": ("#54a24b", "pipeline P2P"), "data_parallel": ("#9467bd", "data-parallel all-reduce"),
         "tied": ("#e377c2", "tied-embedding all-reduce")}


def what_if_figure(sizes: dict, dp: int, pp: int, m: int, net: Cluster, dp_sizes=(1, 2, 4, 8, 16, 32, 64),
                   microbatches=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), tied: bool = True):
    from lab_src.views.static import TimelineFigure
    fig = TimelineFigure(figsize=(11, 3.6), layout="constrained")
    left, right = fig.subplots(1, 2)
    by_dp = {n: predict(plan(n, pp, m, sizes["message_bytes"], sizes["stage_bytes"], sizes["tied_bytes"], tied), net)
             for n in dp_sizes}
    samples = sizes["message_bytes"] * m          # one replica's activations per boundary and direction
    by_m = {k: predict(plan(dp, pp, k, samples / k, sizes["stage_bytes"], sizes["tied_bytes"], tied), net)
            for k in microbatches}
    for ax, series, xlabel in ((left, by_dp, f"data-parallel replicas (each a {pp}-stage pipeline like the measured one)"),
                               (right, by_m, f"micro-batches per replica (its batch fixed; {dp} replicas)")):
        xs = list(series)
        for kind in TRAFFIC_KINDS:
            ys = [series[x][kind] * 1e3 for x in xs]
            if any(ys):
                color, label = STYLE[kind]
                ax.plot(xs, ys, marker="o", ms=3.5, color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel("ms per step, busiest rank (log)", fontsize=9)
        ax.grid(color="#e4e4e4", lw=0.6)
    # a data-parallel ring over dp replicas spans dp x pp ranks: it fits in a node while dp x pp <= ranks per
    # node, and in the cluster while dp x pp <= its ranks; each mark sits between the last size that fits and
    # the first that does not
    edge = between(dp_sizes, lambda n: n * pp <= net.ranks_per_node)
    if edge:
        left.axvline(edge, color="#999", ls="--", lw=1)
        left.text(edge, left.get_ylim()[1], " rings leave a node", fontsize=8, va="top", color="#666")
    full = between(dp_sizes, lambda n: n * pp <= net.nodes * net.ranks_per_node) if net.nodes else None
    if full:
        left.axvspan(full, dp_sizes[-1], color="#f4f4f4", zorder=0)
        left.text(dp_sizes[-1], left.get_ylim()[0], f"more than {net.nodes * net.ranks_per_node} ranks ",
                  fontsize=8, ha="right", va="bottom", color="#888")
    left.axvline(dp, color="#d62728", lw=0.8, alpha=0.5)
    right.axvline(m, color="#d62728", lw=0.8, alpha=0.5)
    left.legend(fontsize=8, frameon=False)
    fig.suptitle(f"predicted communication per step on {net.name} ({pp}-stage pipeline; red: the measured grid)",
                 fontsize=10, x=0.01, ha="left")
    return fig


def between(sizes, fits) -> float | None:
    """The point, on a log axis, between the last of `sizes` that `fits` and the first that does not (None
    when all fit or none does)."""
    for a, b in zip(sizes, sizes[1:]):
        if fits(a) and not fits(b):
            return (a * b) ** 0.5
    return None


def scaling(sizes: dict, pp: int, m: int, net: Cluster, tied: bool = True, hi: int = 64) -> str:
    """What the left panel shows, in its numbers: the data-parallel all-reduce from the first ring that
    leaves a node to `hi` replicas, and whether latency or bandwidth sets its time (a ring of n ranks takes
    2(n-1) steps, each paying the latency, and moves 2(n-1)/n of the buffer)."""
    lo = 2
    while lo * pp <= net.ranks_per_node and lo < hi // 2:
        lo *= 2
    t = {n: predict(plan(n, pp, m, sizes["message_bytes"], sizes["stage_bytes"], sizes["tied_bytes"], tied), net)
         ["data_parallel"] for n in (lo, hi)}
    if not t[lo]:
        return ""
    buffer = max(sizes["stage_bytes"], default=0)
    link = net.inter
    latency = 2 * (hi - 1) * link.latency_s
    bandwidth = 2 * (hi - 1) / hi * buffer / link.bandwidth_Bps
    bound = "latency" if latency > bandwidth else "bandwidth"
    return (f"Once its rings leave a node, the data-parallel all-reduce grows from {t[lo] * 1e3:.3g} ms with {lo} replicas to {t[hi] * 1e3:.3g} ms "
            f"with {hi} ({t[hi] / t[lo]:.1f} x for {hi // lo} x the replicas): a ring of n ranks takes 2(n-1) steps, "
            f"each paying the latency, and with a buffer of {buffer / 2**10:.0f} KiB per stage the {bound} sets the "
            f"time ({2 * (hi - 1)} x {link.latency_s * 1e6:.3g} µs = {latency * 1e3:.3g} ms of latency against "
            f"{bandwidth * 1e3:.3g} ms of bytes at {hi} replicas between nodes)"
            + (", so the time grows roughly linearly with the replicas." if bound == "latency" else
               ": each rank sends about twice its buffer, whatever the ring's length."))
