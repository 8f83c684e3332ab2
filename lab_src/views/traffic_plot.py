"""The what-if plot of q14: predicted communication time per step, by kind, as the grid grows.

Left: against the number of data-parallel replicas, each replica running the measured pipeline on the
same micro-batches (the global batch grows with the replicas). The pipeline's messages stay put, the
data-parallel all-reduce grows with the ring and jumps where the ring leaves a node. Right: against the
number of micro-batches a replica's batch is cut into (its batch fixed): more, smaller messages, each
paying the latency again, while the all-reduce does not change. Where the lines cross, one kind of
traffic becomes the cheaper one.
"""
from __future__ import annotations

from lab_src.pipeline.network import Cluster, plan, predict
from lab_src.pipeline.traffic import TRAFFIC_KINDS

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
    for ax, series, xlabel in ((left, by_dp, "data-parallel replicas (each with the measured pipeline)"),
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
    node_edge = net.ranks_per_node / pp
    if dp_sizes[0] < node_edge < dp_sizes[-1]:
        left.axvline(node_edge, color="#999", ls="--", lw=1)
        left.text(node_edge, left.get_ylim()[1], " rings leave a node", fontsize=8, va="top", color="#666")
    if net.nodes and dp_sizes[-1] * pp > net.nodes * net.ranks_per_node:
        full = net.nodes * net.ranks_per_node / pp       # beyond this, more ranks than the cluster has
        left.axvspan(max(full, dp_sizes[0]), dp_sizes[-1], color="#f4f4f4", zorder=0)
        left.text(dp_sizes[-1], left.get_ylim()[0], f"more than {net.nodes * net.ranks_per_node} ranks ",
                  fontsize=8, ha="right", va="bottom", color="#888")
    left.axvline(dp, color="#d62728", lw=0.8, alpha=0.5)
    right.axvline(m, color="#d62728", lw=0.8, alpha=0.5)
    left.legend(fontsize=8, frameon=False)
    fig.suptitle(f"predicted communication per step on {net.name} ({pp}-stage pipeline; red: the measured grid)",
                 fontsize=10, x=0.01, ha="left")
    return fig
