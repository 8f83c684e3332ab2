"""Kind "interleaved" (q15): each rank builds its `InterleavedStage`
with the case's chunks per rank (the schedule "interleaved:<v>"), run the case's step on it, and observe
the same things a "pipeline" case observes (rank 0's embedding changed once built where the case's
settings say "perturb", as there), plus each chunk's blocks and the activation memory held.

The micro-batches come from an iterator that says what went wrong when a step asks for more than the
batch has: usually a chunk other than the first virtual stage reading tokens instead of receiving
its input (the wrap-around from the last rank to the first).
"""
from __future__ import annotations

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.records import Memory
from lab_src.harness.settings import settings_of
from lab_src.pipeline import data, perturb
from lab_src.pipeline.schedules import schedule
from lab_src.topics.interleaved.chunked import InterleavedStage


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


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    rank, p, m = ctx.rank, case.stages, cfg.num_microbatches
    v = schedule(case.schedule).chunks_per_rank
    stage = None
    try:
        mbs = obs["micro_batch_size"] = observe.micro_batch_size(cfg)
        stage = InterleavedStage(cfg, rank, p, v, mbs, ctx.device, group)
        obs["chunk_layers"] = stage.chunk_layers
        if settings_of(case).perturb and stage.embed is not None:
            # evidence from outside the answer: the outputs must follow a change only rank 0 knows
            obs["perturbed"] = perturb.new_seed()
            perturb.perturb_embedding(stage.embed, obs["perturbed"])
        observe.observe_stage(stage, obs)
        needs = exercises.needs_dataloader(rank, p)
        obs["needs_dataloader"] = observe.plain(needs)
        loader = MicroBatches(data.make_dataloader(cfg, mbs), m, p) if needs else None
        observe.barrier(group)
        returned = exercises.API[case.step](stage, loader, m)
        observe.finish_messages(stage, group, tracer)
        obs["outputs"], obs["loss"] = observe.unpack_step(returned, obs)
        obs["grads"] = observe.gradients(stage)
        obs["memory"] = Memory(peak_held_bytes=stage.peak_held_bytes, peak_held_chunks=stage.peak_held_chunks).to_dict()
    finally:
        obs["waiting"] = stage.waiting if stage is not None else None
        observe.record_instrumentation(obs, tracer)
