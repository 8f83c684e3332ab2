"""`DataParallel`: what a q20 Reducer is given to reduce its buckets with (rank side).

    dp.group, dp.size, dp.rank   the data-parallel group of this stage's replicas, its size, this rank's position
    h = dp.launch(buffer)        hand a contiguous tensor to the rank's reducing thread; returns at once
    h.wait()                     until the buffer holds the sum over the group (raises what the ring raised)
    dp.sum_tied(grad)            with tied embeddings, on the first and last stage: sum the tied weight's gradient
                                 over the two (this replica's first and last stage), recorded as "allreduce_tied"

The reducing thread is lane 1 of the rank (comm/lanes.py `Worker`): it runs the answer's
`ring_all_reduce` (q19; in grading, the reference's) on each buffer, one after another in the order they were
launched, while the main thread goes on with the backward. Its messages are recorded in lane 1, so the deadlock
watch follows them on their own and the timeline draws them in a thin row under the rank's. A wait for a buffer
is journalled as a wait for lane 1 (`trace.waiting_for_lane`) and can be stopped by the check.

Every launch is noted with its time and bytes (`launches`: the judge reads when each bucket left, against the
stage's backward events). The order matters: the ring of launch k on one rank meets the ring of launch k on each
other rank of the group, so replicas must launch the same buckets in the same order.
"""
from __future__ import annotations

import time

import torch

from lab_src.comm import collectives, lanes
from lab_src.pipeline import trace, waiting

LANE = lanes.LANE


class BucketMismatch(RuntimeError):
    """The replicas launched different buckets as the same launch of a step."""


class Launched(lanes.Job):
    """One launched buffer; `wait()` returns once the ring has summed it (the buffer itself)."""

    def __init__(self, index: int, tensor: torch.Tensor, dp: "DataParallel"):
        super().__init__()
        self.index, self.tensor, self.dp = index, tensor, dp
        self.waited = False                 # whether the answer's wait() returned (dp.sum_tied reads it)

    def run(self) -> None:                  # in the reducing lane
        dp = self.dp
        if dp._agree_first and dp.size > 1:
            with trace.waiting("allreduce_dp", tuple(dp.ranks)):    # journalled as a collective
                dp._agree(self)
        if dp._all_reduce is not None:
            dp._all_reduce(self.tensor, dp.group)
        else:
            lanes.ring_all_reduce(self.tensor, dp.group, "q20")

    def wait(self) -> torch.Tensor:
        super().wait()
        self.waited = True
        return self.tensor


class DataParallel:
    def __init__(self, group, ranks: list[int], rank: int, all_reduce=None, agree: bool = True, tied=None):
        """`all_reduce(tensor, group)`: what sums a buffer (default: the answer's q19 ring; benchmarks/buckets_vs_ddp.py
        also times gloo's). `agree`: before each ring, the replicas compare what they are about to sum (a small
        all-gather of the lab's, never recorded), so that buckets launched in different orders are named instead
        of crashing the collective library."""
        self.group, self.ranks = group, list(ranks)
        self._all_reduce, self._agree_first = all_reduce, agree
        self._tied = tied                     # (group, global ranks) of this replica's first and last stage, or None
        self.tied_sums: list[list] = []       # [perf_counter, bytes, whether every launched bucket had been waited for]
        self.size, self.rank = len(self.ranks), self.ranks.index(rank)
        self.launches: list[list] = []        # [perf_counter, bytes, numel] of each launch of this step
        self._handles: list[Launched] = []
        self._lane = lanes.Worker("lab-reducer")

    def __repr__(self) -> str:
        return f"DataParallel(size={self.size}, rank={self.rank}, ranks={self.ranks})"

    def launch(self, tensor) -> Launched:
        """Sum `tensor` in place over the data-parallel group, in the rank's reducing thread, after every buffer
        launched before it. Returns at once; `wait()` on what it returns before reading the tensor."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"dp.launch needs a tensor (a bucket's gradients flattened into one buffer), got "
                            f"{type(tensor).__name__}")
        if not tensor.is_contiguous():
            raise ValueError("dp.launch needs a contiguous tensor: the ring sums it through view(-1). Flatten the "
                             "bucket's gradients into one new buffer (torch.cat of each .grad.reshape(-1))")
        self.launches.append([time.perf_counter(), tensor.numel() * tensor.element_size(), tensor.numel()])
        tracer = trace.active()
        if tracer is not None:      # the journal's line, read by the grader as the run goes (judge_buckets.py)
            tracer.mark("launch", len(self.launches) - 1)
        handle = Launched(len(self.launches) - 1, tensor, self)
        self._handles.append(handle)
        return self._lane.submit(handle)

    def _agree(self, handle: Launched) -> None:
        """Every replica learns what the others launched as this launch of the step; a difference raises on all."""
        gather = collectives.lab("all_gather")      # the lab's own: not the answer's
        t = handle.tensor
        mine = torch.tensor([handle.index, t.numel(), t.element_size()], dtype=torch.int64)
        seen = [torch.empty_like(mine) for _ in self.ranks]
        waiting.wait(gather(seen, mine, group=self.group, async_op=True))
        said = {r: tuple(int(x) for x in s.tolist()) for r, s in zip(self.ranks, seen)}
        if len(set(said.values())) > 1:
            what = "; ".join(f"rank {r}: {n * e:,} B" for r, (_, n, e) in said.items())
            raise BucketMismatch(
                f"launch {handle.index} of the step carries different buckets on the replicas ({what}). The k-th ring "
                f"of each replica sums together with the k-th of the others, so every replica must launch the same "
                f"buckets in the same order: the plan's, a bucket once it and every bucket before it are full, "
                f"whatever order the hooks fire in")

    def sum_tied(self, grad) -> None:
        """Sum `grad` (the tied embedding's gradient) in place over this replica's first and last stage."""
        if self._tied is None:
            raise ValueError("dp.sum_tied: this stage holds no tied embedding (only the first and the last stage of a "
                             "pipeline with tied embeddings do: stage.tied_embedding is None here)")
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"dp.sum_tied needs the tied embedding's gradient, a tensor; got {type(grad).__name__} "
                            f"(.grad is None before a backward has reached it)")
        group, ranks = self._tied
        self.tied_sums.append([time.perf_counter(), grad.numel() * grad.element_size(),
                               all(h.is_completed() and h.waited for h in self._handles)])
        reduce = collectives.lab("all_reduce")      # the lab's: recorded as its own kind
        with trace.span("allreduce_tied", None, None, tuple(grad.shape), grad.numel() * grad.element_size(),
                        group=tuple(ranks)):
            if len(ranks) > 1:
                waiting.wait(reduce(grad, group=group, async_op=True))

    def new_step(self) -> None:
        self.tied_sums = []
        self.launches = []

    def drain(self) -> None:
        """Wait for every buffer launched so far (the harness, after the step): raise the first ring's error."""
        for handle in self._handles:
            handle.wait()
        self._handles = []

    def close(self) -> None:
        self._lane.close()

