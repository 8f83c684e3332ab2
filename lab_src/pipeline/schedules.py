"""Pipeline schedules as data: each rank's program, and the rules a run must keep.

    from lab_src.pipeline.schedules import SCHEDULES, Op
    SCHEDULES["1f1b"].program(rank=0, p=4, m=8)        # [0F0, 0SEND_F0, 0F1, ...] (Steps, in torch's grammar)
    SCHEDULES["afab"].violations(events, p=4, m=8)      # [] when the run kept All-Forward-All-Backward's rules

The operations and a program's steps (`Op`, `Step`) are defined in pipeline/ops.py and imported from
here too. A pipeline of `p` ranks runs `v` model chunks per rank (v = 1 except for interleaved
schedules): chunk c of rank r is virtual stage c * p + r, the stage a step names.

A schedule declares two things: its `program` (the ordered operations of each rank, point-to-point
ones included, those that do nothing at the ends of the pipeline left out) and its invariants
(`violations`, read from the events a run recorded). Judges, the communication probes, the ideal
timeline and the case runner read the schedule of the case; none of them assumes a particular one.
"""
from __future__ import annotations

from collections import Counter

from lab_src.pipeline.ops import Op, Step, letters


def _forward(rank: int, p: int, mb: int, chunk: int = 0, v: int = 1, noops: bool = False) -> list[Step]:
    """recv_forward, forward, send_forward of one micro-batch (the no-ops at the ends left out unless `noops`)."""
    ops = (Op.RECV_FORWARD, Op.FORWARD, Op.SEND_FORWARD)
    return [Step(chunk * p + rank, op, mb, chunk) for op in ops if noops or not op.is_noop(rank, p, chunk, v)]


def _backward(rank: int, p: int, mb: int, chunk: int = 0, v: int = 1, noops: bool = False) -> list[Step]:
    ops = (Op.RECV_BACKWARD, Op.BACKWARD, Op.SEND_BACKWARD)
    return [Step(chunk * p + rank, op, mb, chunk) for op in ops if noops or not op.is_noop(rank, p, chunk, v)]


class Schedule:
    """What every schedule declares. Subclasses give `program` and `violations`."""
    name = ""
    title = ""
    summary = ""          # what the schedule does, in a sentence, for a run told it kept another one
    chunks_per_rank = 1

    def program(self, rank: int, p: int, m: int, noops: bool = False) -> list[Step]:
        """Rank `rank`'s operations in order. With `noops`, also the point-to-point operations that do
        nothing at the ends of the pipeline (a communication check calls those too)."""
        raise NotImplementedError

    def messages(self, rank: int, p: int, m: int) -> list[Step]:
        """The point-to-point operations of the program, the no-ops at the ends included, in order."""
        return [s for s in self.program(rank, p, m, noops=True) if not s.op.is_compute]

    def max_in_flight(self, rank: int, p: int, m: int) -> int:
        """The most forward chunks whose backward has not run that rank `rank` may hold at once."""
        return m * self.chunks_per_rank

    def violations(self, events, p: int, m: int) -> list[tuple[int, int | None, str]]:
        """(rank, micro-batch, what is wrong) for every rule of this schedule the run broke."""
        return in_flight_violations(self, events, p, m)

    def counts(self, rank: int, p: int, m: int) -> Counter:
        """How many operations of each kind rank `rank` runs in one step."""
        return Counter(s.op for s in self.program(rank, p, m))


class AllForwardAllBackward(Schedule):
    name = "afab"
    title = "All-Forward-All-Backward"
    summary = ("All-Forward-All-Backward runs every forward of the step before its first backward: each rank "
               "holds all m micro-batches at once.")

    def program(self, rank, p, m, noops=False):
        steps = []
        for mb in range(m):
            steps += _forward(rank, p, mb, noops=noops)
        for mb in range(m):
            steps += _backward(rank, p, mb, noops=noops)
        return steps

    def violations(self, events, p, m):
        found = []
        for r in range(p):
            compute = compute_order(events, r)
            first_b = next((i for i, e in enumerate(compute) if Op(e.kind).phase == "backward"), None)
            late = [e for e in compute[first_b:] if e.kind == Op.FORWARD] if first_b is not None else []
            if late:
                found.append((r, late[0].microbatch, f"forward of micro-batch {late[0].microbatch} runs after a "
                                                     f"backward: {self.title} runs every forward first"))
        return found


class OneForwardOneBackward(Schedule):
    """Warm-up forwards, then one forward and one backward in turn, then the remaining backwards.
    Rank r runs min(p - r - 1, m) warm-up forwards, so it never holds more than min(p - r, m)
    micro-batches whose backward has not run (AFAB holds all m)."""
    name = "1f1b"
    title = "One-Forward-One-Backward"
    summary = ("One-Forward-One-Backward starts each micro-batch's backward as soon as its gradient can come back: "
               "after a short warm-up of forwards, each rank alternates one forward and one backward, then finishes "
               "the remaining backwards, so rank r holds at most min(p - r, m) micro-batches at once, not all m.")

    def warmup(self, rank: int, p: int, m: int) -> int:
        return min(p - rank - 1, m)

    def program(self, rank, p, m, noops=False):
        warm = self.warmup(rank, p, m)
        steps = []
        for mb in range(warm):
            steps += _forward(rank, p, mb, noops=noops)
        for i in range(m - warm):
            steps += _forward(rank, p, warm + i, noops=noops)
            steps += _backward(rank, p, i, noops=noops)
        for mb in range(m - warm, m):
            steps += _backward(rank, p, mb, noops=noops)
        return steps

    def max_in_flight(self, rank, p, m):
        return min(p - rank, m)

    def violations(self, events, p, m):
        """Its memory bound first (at most min(p - r, m) micro-batches held); then each rank's order,
        which for 1F1B is one order only: its warm-up, one forward and one backward in turn, its cool-down."""
        found = in_flight_violations(self, events, p, m)
        for r in range(p):
            if any(f[0] == r for f in found):
                continue
            got = [(e.kind, e.microbatch) for e in compute_order(events, r)]
            want = [(s.op.value, s.microbatch) for s in self.program(r, p, m) if s.op.is_compute]
            if got != want:
                at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
                mb = (got[at] if at < len(got) else want[at])[1]
                found.append((r, mb, f"rank {r} runs {letters(got)}; {self.title} runs {letters(want)} "
                                     f"({self.warmup(r, p, m)} warm-up forward{'' if self.warmup(r, p, m) == 1 else 's'}, min(p - r - 1, m), then one forward "
                                     f"and one backward in turn, then the remaining backwards)"))
        return sorted(found, key=lambda f: f[0])


class Interleaved1F1B(Schedule):
    """Interleaved One-Forward-One-Backward with `v` chunks per rank (rank r holds chunks r, r + p, ...).

    Micro-batches go through in groups of p: forward of chunk 0 for micro-batches 0..p-1, then chunk 1
    for the same micro-batches, and so on; backwards visit the chunks in reverse. Rank r runs
    (p - r - 1) * 2 + (v - 1) * p warm-up forwards (at most m * v), as in Megatron-LM's schedule; m must
    be a multiple of p. Its rules: that warm-up bound on the chunk forwards a rank holds, and the order in
    which each rank's forwards and backwards visit (micro-batch, chunk) (`order`, `order_violations`)."""
    name = "interleaved"
    title = "Interleaved 1F1B"

    def __init__(self, v: int = 2):
        if v < 1:
            raise ValueError(f"an interleaved schedule needs at least one chunk per rank, got {v}")
        self.chunks_per_rank = v
        self.name = "interleaved" if v == 2 else f"interleaved:{v}"   # schedule(name) finds it again

    def _order(self, p: int, m: int, k: int, backward: bool) -> tuple[int, int]:
        v = self.chunks_per_rank
        group, within = divmod(k, p * v)
        chunk = within // p
        return group * p + within % p, (v - 1 - chunk if backward else chunk)

    def order(self, p: int, m: int, backward: bool = False) -> list[tuple[int, int]]:
        """(micro-batch, chunk) of each forward (or backward) of a rank, in the order it runs them: chunk 0
        for micro-batches 0..p-1, chunk 1 for the same group, ...; backwards visit the chunks in reverse."""
        return [self._order(p, m, k, backward) for k in range(m * self.chunks_per_rank)]

    def warmup(self, rank: int, p: int, m: int) -> int:
        v = self.chunks_per_rank
        return min((p - rank - 1) * 2 + (v - 1) * p, m * v)

    def program(self, rank, p, m, noops=False):
        if m % p:
            raise ValueError(f"{self.title} needs the number of micro-batches ({m}) to be a multiple of the "
                             f"number of ranks ({p})")
        v, total = self.chunks_per_rank, m * self.chunks_per_rank
        warm = self.warmup(rank, p, m)
        f = lambda k: _forward(rank, p, *self._order(p, m, k, False), v, noops)    # noqa: E731
        b = lambda k: _backward(rank, p, *self._order(p, m, k, True), v, noops)    # noqa: E731
        steps = []
        for k in range(warm):
            steps += f(k)
        for i in range(total - warm):
            steps += f(warm + i) + b(i)
        for k in range(total - warm, total):
            steps += b(k)
        return steps

    def max_in_flight(self, rank, p, m):
        return self.warmup(rank, p, m) + (1 if self.warmup(rank, p, m) < m * self.chunks_per_rank else 0)

    def violations(self, events, p, m):
        return in_flight_violations(self, events, p, m) + self.order_violations(events, p, m)

    def order_violations(self, events, p: int, m: int) -> list[tuple[int, int | None, str]]:
        """Where a rank's forwards (or backwards) visit (micro-batch, chunk) in another order than `order`:
        the first place on each rank, said in terms of the groups of p micro-batches."""
        found = []
        for r in range(p):
            compute = compute_order(events, r)
            for op, backward in ((Op.FORWARD, False), (Op.BACKWARD, True)):
                got = [(e.microbatch, e.chunk) for e in compute if e.kind == op]
                want = self.order(p, m, backward)
                k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
                if k is None:
                    continue
                (mb, c), (want_mb, want_c) = got[k], want[k]
                group = want_mb - want_mb % p
                rule = (f"chunk {want_c} takes micro-batches {group}..{group + p - 1} one after the other before "
                        f"the same group moves on to the next chunk" if not backward else
                        f"backwards visit the chunks in reverse (chunk {self.chunks_per_rank - 1} first), "
                        f"micro-batches {group}..{group + p - 1} for each chunk in turn")
                found.append((r, mb, f"{op} number {k + 1} of this rank ran micro-batch {mb} on chunk {c}; "
                                     f"{self.title} runs micro-batch {want_mb} on chunk {want_c} there: {rule}"))
        return found


class ZeroBubbleH1(Schedule):
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2024; torch's ScheduleInterleavedZeroBubble with
    one stage per rank): 1F1B's warm-up and steady state with each backward split in two, I (the input's
    gradient, sent to the previous stage as soon as it is computed) and W (the weights' gradients, which
    nobody waits for). Rank r runs backward number k's W right after backward number k + r's I, and its
    last r W's at the end of the step, where 1F1B would wait: the last rank defers the most, the first
    none. A micro-batch counts as held from its forward until its W, so every rank holds at most
    min(p, m), the first stage's bound in 1F1B (whose peak memory ZB-H1 keeps). Its rules: that bound,
    1F1B's order of forwards and input gradients, every W after its I, and each gradient sent before
    the rank computes anything else."""
    name = "zbh1"
    title = "ZB-H1 (zero bubble)"
    summary = ("ZB-H1 splits each backward into I (the input's gradient, which the previous stage waits for: sent "
               "as soon as I ends) and W (the weights' gradients, which nobody waits for), and moves rank r's W's "
               "r slots later, into the time 1F1B spends waiting at the end of the step.")

    def warmup(self, rank: int, p: int, m: int) -> int:
        return min(p - rank - 1, m)

    def program(self, rank, p, m, noops=False):
        warm = self.warmup(rank, p, m)
        w = lambda k: [Step(rank, Op.BACKWARD_WEIGHT, k)]       # noqa: E731
        steps, done_i = [], 0

        def backward(mb):
            nonlocal done_i
            out = [s for s in _backward(rank, p, mb, noops=noops)]
            out = [Step(s.stage, Op.BACKWARD_INPUT, mb) if s.op is Op.BACKWARD else s for s in out]
            done_i += 1
            return out + (w(done_i - 1 - rank) if done_i - 1 >= rank else [])

        for mb in range(warm):
            steps += _forward(rank, p, mb, noops=noops)
        for i in range(m - warm):
            steps += _forward(rank, p, warm + i, noops=noops) + backward(i)
        for mb in range(m - warm, m):
            steps += backward(mb)
        for k in range(max(0, m - rank), m):
            steps += w(k)
        return steps

    def max_in_flight(self, rank, p, m):
        return min(p, m)

    def violations(self, events, p, m):
        """The bound on what a rank holds; 1F1B's order of forwards and I's; each W after its I and each
        gradient sent before the rank computes anything else (`split_violations`); and where the W's go,
        the rule that makes the bubble smaller: backward k's W right after backward k + r's I."""
        found = in_flight_violations(self, events, p, m)
        for r in range(p):
            if any(f[0] == r for f in found):
                continue
            compute = compute_order(events, r)
            got = [(e.kind, e.microbatch) for e in compute if e.kind != Op.BACKWARD_WEIGHT]
            want = [(s.op.value, s.microbatch) for s in self.program(r, p, m)
                    if s.op.is_compute and s.op is not Op.BACKWARD_WEIGHT]
            if got != want:
                at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
                mb = (got[at] if at < len(got) else want[at])[1]
                found.append((r, mb, f"rank {r} runs {letters(got)} (W left out); {self.title} runs "
                                     f"{letters(want)}: 1F1B's order, each backward's input half (I) in the "
                                     f"place of its backward"))
                continue
            split = split_violations(events, r)
            found += split or self.w_placement(compute, r, p, m)
        return sorted(found, key=lambda f: f[0])

    def w_placement(self, compute, rank: int, p: int, m: int) -> list[tuple[int, int | None, str]]:
        """Each W where ZB-H1 puts it: rank r runs backward k's W right after backward k + r's I (its last r
        W's after its last I), so that the W's fill the end of the step where 1F1B waits."""
        got = [(e.kind, e.microbatch) for e in compute]
        want = [(s.op.value, s.microbatch) for s in self.program(rank, p, m) if s.op.is_compute]
        if got == want:
            return []
        at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        late = next(((k, mb) for k, mb in got[at:] if k == Op.BACKWARD_WEIGHT), None)
        at_once = all(got[i - 1] == (Op.BACKWARD_INPUT, mb) for i, (k, mb) in enumerate(got) if k == Op.BACKWARD_WEIGHT)
        mb = (late or got[at] if at < len(got) else want[at])[1]
        why = (f"rank {rank} runs each W right after its own I ({letters(got)}): the W's are never delayed, so they "
               f"fill nothing, and the end of the step waits as in 1F1B (the bubble stays 1F1B's). " if at_once else
               f"rank {rank} runs {letters(got)}; ")
        return [(rank, mb, why + f"{self.title} runs {letters(want)}: rank r runs backward k's W right after "
                                f"backward k + r's I ({rank} backward{'' if rank == 1 else 's'} late here), and its "
                                f"last {rank} W's after its last I")]


class OneForwardOneBackwardSplit(Schedule):
    """1F1B with each backward split in two and run at once, I then its W: ZB-H1's first step, which moves
    nothing. A valid schedule (its numbers and memory are 1F1B's), not the one q16 asks for: its W's fill no
    bubble. Its rules: 1F1B's bound on what a rank holds, and its order with each backward as I then W."""
    name = "1f1b_split"
    title = "One-Forward-One-Backward with the backward split (each W right after its I)"
    summary = OneForwardOneBackward.summary

    def program(self, rank, p, m, noops=False):
        warm = OneForwardOneBackward().warmup(rank, p, m)

        def backward(mb):       # I, its gradient sent on, then W
            out = [Step(s.stage, Op.BACKWARD_INPUT, mb) if s.op is Op.BACKWARD else s
                   for s in _backward(rank, p, mb, noops=noops)]
            return out + [Step(rank, Op.BACKWARD_WEIGHT, mb)]
        steps = []
        for mb in range(warm):
            steps += _forward(rank, p, mb, noops=noops)
        for i in range(m - warm):
            steps += _forward(rank, p, warm + i, noops=noops) + backward(i)
        for mb in range(m - warm, m):
            steps += backward(mb)
        return steps

    def max_in_flight(self, rank, p, m):
        return min(p - rank, m)

    def violations(self, events, p, m):
        found = in_flight_violations(self, events, p, m)
        for r in range(p):
            if any(f[0] == r for f in found):
                continue
            got = [(e.kind, e.microbatch) for e in compute_order(events, r)]
            want = [(s.op.value, s.microbatch) for s in self.program(r, p, m) if s.op.is_compute]
            if got != want:
                at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
                found.append((r, (got[at] if at < len(got) else want[at])[1],
                              f"rank {r} runs {letters(got)}; {self.title} runs {letters(want)}"))
                continue
            found += split_violations(events, r)
        return sorted(found, key=lambda f: f[0])


def split_violations(events, rank: int) -> list[tuple[int, int | None, str]]:
    """A split backward's rules on one rank: each W after the I of its micro-batch, and the gradient I
    computed sent to the previous stage before the rank computes anything else (the first rules of
    every zero-bubble schedule)."""
    found, seen_i = [], set()
    compute = compute_order(events, rank)
    for e in compute:
        if e.kind == Op.BACKWARD_INPUT:
            seen_i.add(e.microbatch)
        elif e.kind == Op.BACKWARD_WEIGHT and e.microbatch not in seen_i:
            return [(rank, e.microbatch, f"W{e.microbatch} (the weights' gradients) runs before I{e.microbatch}, "
                                         f"the input's gradient of the same micro-batch: W continues what I began")]
    sends = {e.microbatch: e for e in events if e.rank == rank and e.kind == Op.SEND_BACKWARD}
    for i, e in enumerate(compute):
        send = sends.get(e.microbatch)
        if e.kind != Op.BACKWARD_INPUT or send is None:
            continue
        late = [c for c in compute[i + 1:] if c.t_start < send.t_start]
        if late:
            found.append((rank, e.microbatch, f"the gradient of micro-batch {e.microbatch} goes to the previous stage "
                                              f"only after {letters([(c.kind, c.microbatch) for c in late])}: send "
                                              f"it as soon as I{e.microbatch} ends, the previous stage waits for it "
                                              f"(the bubble comes back)"))
            break
    return found


def compute_order(events, rank: int) -> list:
    """The compute events (forwards, backwards, ...) of one rank, in the order they ran."""
    return sorted((e for e in events if e.rank == rank and _computes(e.kind)), key=lambda e: e.t_start)


def _computes(kind) -> bool:
    op = Op.of(kind)
    return op is not None and op.is_compute


def in_flight(events, rank: int) -> list[int]:
    """After each compute event of `rank`, how many micro-batches it holds for their backward (`Op.holds`)."""
    held, out = 0, []
    for e in compute_order(events, rank):
        held += Op(e.kind).holds
        out.append(held)
    return out


def in_flight_violations(schedule: Schedule, events, p: int, m: int) -> list[tuple[int, int | None, str]]:
    found = []
    for r in range(p):
        limit = schedule.max_in_flight(r, p, m)
        for e, held in zip(compute_order(events, r), in_flight(events, r)):
            if held > limit:
                found.append((r, e.microbatch, f"after the forward of micro-batch {e.microbatch} this rank holds "
                                               f"{held} micro-batches whose backward has not run; {schedule.title} "
                                               f"holds at most {limit} on rank {r} of {p}"))
                break
    return found


SCHEDULES: dict[str, Schedule] = {s.name: s for s in (AllForwardAllBackward(), OneForwardOneBackward(),
                                                      Interleaved1F1B(2), ZeroBubbleH1(), OneForwardOneBackwardSplit())}


def schedule(name: str) -> Schedule:
    """The schedule named `name`; "interleaved:4" is Interleaved 1F1B with 4 chunks per rank."""
    if name in SCHEDULES:
        return SCHEDULES[name]
    base, _, v = name.partition(":")
    if base == "interleaved" and v.isdigit() and int(v) >= 1:
        return Interleaved1F1B(int(v))
    raise KeyError(f"no schedule {name!r}; the schedules are {', '.join(SCHEDULES)} (and interleaved:<v>)")


def matching_schedules(events, p: int, m: int) -> list[Schedule]:
    """The declared schedules (one chunk per rank) whose rules a run kept."""
    return [s for s in SCHEDULES.values() if s.chunks_per_rank == 1 and not s.violations(events, p, m)]


class ForwardOnly(Schedule):
    """Evaluation: every micro-batch forward through the pipeline, in order, and no backward. Not a
    training schedule, so it is not in SCHEDULES: no training step is ever judged against it."""
    name = "forward"
    title = "forward only (evaluation)"

    def program(self, rank, p, m, noops=False):
        steps = []
        for mb in range(m):
            steps += _forward(rank, p, mb, noops=noops)
        return steps

    def violations(self, events, p, m):
        found = []
        for r in range(p):
            late = [e for e in compute_order(events, r) if Op(e.kind).phase == "backward"]
            if late:
                found.append((r, late[0].microbatch, "a backward ran during evaluation, which is forward only"))
        return found


FORWARD_ONLY = ForwardOnly()
