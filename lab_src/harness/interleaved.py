"""What one rank does for an interleaved pipeline case (kind "interleaved"): build its `InterleavedStage`
with the case's chunks per rank (the schedule "interleaved:<v>"), run the case's step on it, and observe
the same things a "pipeline" case observes, plus each chunk's blocks and the activation memory held.

The micro-batches come from an iterator that says what went wrong when a step asks for more than the
batch has: usually a chunk other than the first virtual stage reading tokens instead of receiving
its input (the wrap-around from the last rank to the first).
"""
from __future__ import annotations

import torch.distributed as dist

from lab_src import exercises
from lab_src.harness import cases
from lab_src.pipeline import data
from lab_src.pipeline.chunked import InterleavedStage
from lab_src.pipeline.schedules import schedule


class NoMoreMicroBatches(StopIteration):
    """The step asked the dataloader for more micro-batches than the batch holds."""


class MicroBatches:
    """The dataloader's micro-batches, counted; asking for one more raises a `NoMoreMicroBatches`
    that says which chunk reads tokens in an interleaved pipeline."""

    def __init__(self, loader, m: int, p: int):
        self._it, self.m, self.p, self.taken = iter(loader), m, p, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.taken >= self.m:
            raise NoMoreMicroBatches(
                f"the step asked the dataloader for micro-batch number {self.taken + 1}, but the batch has "
                f"{self.m}: only chunk 0 of rank 0 (virtual stage 0) reads tokens, once per micro-batch. Rank 0's "
                f"other chunks receive their input from rank {self.p - 1} (the wrap-around from the last rank "
                f"to the first)")
        self.taken += 1
        return next(self._it)


def run_interleaved(case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    rank, p, m = ctx.rank, case.stages, cfg.num_microbatches
    v = schedule(case.schedule).chunks_per_rank
    stage = None
    try:
        mbs = obs["micro_batch_size"] = cases._micro_batch_size(cfg)
        stage = InterleavedStage(cfg, rank, p, v, mbs, ctx.device, group)
        obs["chunk_layers"] = stage.chunk_layers
        obs["layers"] = stage.layer_ids
        obs["activation_shape"] = list(stage.activation_shape)
        needs = exercises.needs_dataloader(rank, p)
        obs["needs_dataloader"] = cases.plain(needs)
        loader = MicroBatches(data.make_dataloader(cfg, mbs), m, p) if needs else None
        cases._barrier(group)
        returned = exercises.API[case.step](stage, loader, m)
        cases._finish_messages(stage, group, tracer)
        outputs, loss = cases._unpack_step(returned, obs)
        obs["outputs"] = outputs
        obs["loss"] = loss
        obs["grads"] = {n: (q.grad.detach().cpu().clone() if q.grad is not None else None)
                        for n, q in stage.named_parameters()}
        obs["memory"] = {"peak_held_bytes": stage.peak_held_bytes, "peak_held_chunks": stage.peak_held_chunks}
    finally:
        obs["waiting"] = stage.waiting if stage is not None else None
        cases._record_instrumentation(obs, tracer)
