"""A what-if model of a step's communication (q14): what each message and each all-reduce would cost on a
network you describe, next to what they cost in the run that was measured.

The model, per operation:

    a message of b bytes between two ranks      latency + b / bandwidth        (of the link between them)
    a ring all-reduce of b bytes over n ranks   2 (n - 1) x (latency + (b / n) / bandwidth)

A ring cuts the buffer into n pieces and passes them round twice (n - 1 steps to add them up, n - 1 to
hand the sums round), so each rank sends 2 (n - 1) / n of the buffer; a ring is as fast as its slowest
link. Ranks sit on nodes in order (rank // ranks_per_node): a fast link inside a node, a slower one
between nodes.

Time is counted per rank and kind: each rank's messages (the time its sends take) and the all-reduces it
takes part in; a kind's time is that of the rank that spends the most on it. `measure` reads the same
figure from a run: a message's time from the start of its send (or of its receive, if that came later)
to the end of its receive; an all-reduce's from the moment the last member joined to the moment the last
member left.
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.topics.dp_pp.traffic import TRAFFIC_KINDS, kind_of
from lab_src.pipeline.trace import Event


@dataclass(frozen=True)
class Link:
    latency_s: float
    bandwidth_Bps: float

    def time(self, nbytes: float) -> float:
        return self.latency_s + nbytes / self.bandwidth_Bps

    def describe(self) -> str:
        return f"{self.latency_s * 1e6:.3g} µs + bytes / {self.bandwidth_Bps / 1e9:.3g} GB/s"


@dataclass(frozen=True)
class Cluster:
    ranks_per_node: int
    intra: Link              # between ranks of one node
    inter: Link              # between nodes
    name: str = "cluster"
    nodes: int = 0           # how many nodes there are (0: as many as it takes)

    def node(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def link(self, a: int, b: int) -> Link:
        return self.intra if self.node(a) == self.node(b) else self.inter

    def message_s(self, src: int, dst: int, nbytes: float) -> float:
        return self.link(src, dst).time(nbytes)

    def allreduce_s(self, ranks, nbytes: float) -> float:
        ranks = sorted(ranks)
        n = len(ranks)
        if n < 2:
            return 0.0
        link = self.inter if len({self.node(r) for r in ranks}) > 1 else self.intra
        return 2 * (n - 1) * link.time(nbytes / n)

    def describe(self) -> str:
        if self.intra == self.inter:
            return f"{self.name}: every message {self.intra.describe()}"
        return (f"{self.name}: {self.ranks_per_node} ranks per node; inside a node {self.intra.describe()}, "
                f"between nodes {self.inter.describe()}")


def cluster(nodes: int, ranks_per_node: int, intra_gbps: float, inter_gbps: float, intra_latency_us: float,
            inter_latency_us: float) -> Cluster:
    """A cluster as a student describes it: link speeds in gigabits per second, latencies in microseconds."""
    return Cluster(ranks_per_node, Link(intra_latency_us * 1e-6, intra_gbps * 1e9 / 8),
                   Link(inter_latency_us * 1e-6, inter_gbps * 1e9 / 8),
                   f"{nodes} node{'s' if nodes > 1 else ''} x {ranks_per_node} ranks", nodes)


def this_machine(link: dict | None) -> Cluster:
    """This machine's collective library over loopback, from the ping-pong the check timed
    ({bytes: one-way seconds} for a tiny and a large message)."""
    if not link:
        return Cluster(1 << 16, Link(100e-6, 1e9), Link(100e-6, 1e9), "this machine (assumed)", 1)
    sizes = sorted((int(b), float(t)) for b, t in link.items())
    (b0, t0), (b1, t1) = sizes[0], sizes[-1]
    bandwidth = (b1 - b0) / max(t1 - t0, 1e-9)
    here = Link(t0, bandwidth)
    return Cluster(1 << 16, here, here, "this machine (ping-pong)", 1)


# ---- operations: from a run's record, or planned for a step that never ran ---------------------------
@dataclass(frozen=True)
class Operation:
    kind: str            # "pipeline", "data_parallel", "tied"
    ranks: tuple         # (src, dst) of a message; the group of an all-reduce
    nbytes: float
    collective: bool


def operations(events: list[Event]) -> list[Operation]:
    """The record's messages (one per send, global peers) and all-reduces (one per call)."""
    from lab_src.views.prepare import collective_calls
    ops = [Operation(kind_of(e), (e.rank, e.peer), e.bytes, False) for e in events if e.is_send and kind_of(e)]
    ops += [Operation(kind_of(members[0]), tuple(group), members[0].bytes, True)
            for _, group, members in collective_calls(events)]
    return ops


def plan(dp: int, pp: int, m: int, message_bytes: float, stage_bytes: list[float], tied_bytes: float,
         tied: bool = True) -> list[Operation]:
    """The operations of one step of a dp x pp grid (rank = d * pp + p) with m micro-batches, each message
    `message_bytes`, stage p's gradients `stage_bytes[p]` reduced in one buffer, the tied copy `tied_bytes`."""
    ops = []
    for d in range(dp):
        for p in range(pp - 1):
            a, b = d * pp + p, d * pp + p + 1
            ops += [Operation("pipeline", (a, b), message_bytes, False)] * m      # activations forward
            ops += [Operation("pipeline", (b, a), message_bytes, False)] * m      # their gradients back
        if tied and pp > 1:
            ops.append(Operation("tied", (d * pp, d * pp + pp - 1), tied_bytes, True))
    if dp > 1:
        ops += [Operation("data_parallel", tuple(d * pp + p for d in range(dp)), stage_bytes[p], True) for p in range(pp)]
    return ops


def predict(ops: list[Operation], net: Cluster) -> dict[str, float]:
    """Seconds per kind on the busiest rank, under the model."""
    per_rank: dict[int, dict[str, float]] = {}
    for op in ops:
        if op.collective:
            t = net.allreduce_s(op.ranks, op.nbytes)
            members = op.ranks
        else:
            t = net.message_s(op.ranks[0], op.ranks[1], op.nbytes)
            members = op.ranks[:1]
        for r in members:
            per_rank.setdefault(r, dict.fromkeys(TRAFFIC_KINDS, 0.0))[op.kind] += t
    return busiest(per_rank)


def measure(events: list[Event]) -> dict[str, float]:
    """Seconds per kind on the busiest rank, as the run went (global peers: see topics/dp_pp/timeline.py)."""
    from lab_src.pipeline.matching import match
    from lab_src.views.prepare import collective_calls
    per_rank: dict[int, dict[str, float]] = {}
    for send, recv in match(events).pairs:
        t = max(0.0, recv.t_end - max(send.t_start, recv.t_start))
        per_rank.setdefault(send.rank, dict.fromkeys(TRAFFIC_KINDS, 0.0))[kind_of(send)] += t
    for _, group, members in collective_calls(events):
        t = max(e.t_end for e in members) - max(e.t_start for e in members)
        for e in members:
            per_rank.setdefault(e.rank, dict.fromkeys(TRAFFIC_KINDS, 0.0))[kind_of(e)] += max(0.0, t)
    return busiest(per_rank)


def busiest(per_rank: dict[int, dict[str, float]]) -> dict[str, float]:
    return {k: max((t[k] for t in per_rank.values()), default=0.0) for k in TRAFFIC_KINDS}


def sizes_of(events: list[Event], dp: int, pp: int) -> dict:
    """What a plan needs, read from a run: one message's bytes, each stage's gradient bytes (summed over
    its data-parallel all-reduces), the tied copy's bytes."""
    message = max((e.bytes for e in events if e.is_send), default=0)
    stage = [0.0] * pp
    for e in events:
        if e.kind == "allreduce_dp" and e.rank < pp:        # replica 0's ranks are stages 0..pp-1
            stage[e.rank] += e.bytes
    tied = max((e.bytes for e in events if e.kind == "allreduce_tied"), default=0)
    return {"message_bytes": message, "stage_bytes": stage, "tied_bytes": tied}


def table(predicted: dict[str, dict[str, float]], measured: dict[str, float] | None = None) -> str:
    """Milliseconds per kind: each network's prediction, and the measurement."""
    names = list(predicted)
    widths = [max(len(n), 12) + 3 for n in names]
    head = f"{'kind':<15}" + "".join(f"{n:>{w}}" for n, w in zip(names, widths)) + \
        (f"{'measured here':>16}" if measured else "")
    lines = [head]
    for k in TRAFFIC_KINDS:
        row = f"{k:<15}" + "".join(f"{predicted[n][k] * 1e3:>{w - 3}.3f} ms" for n, w in zip(names, widths))
        if measured:
            row += f"{measured[k] * 1e3:>13.3f} ms"
        lines.append(row)
    return "\n".join(lines)
