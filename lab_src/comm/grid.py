"""A grid case: a data x pipeline grid of all the case's ranks, as q14's answer builds it, made by the lab.

    with grid_case(case, ctx, group, tracer, obs) as grid:     # the prologue: mesh, groups, recorders bounded
        stage = grid.stage()                                   # this rank's PipelineStage (or `cls`), observed
        ... the kind's steps: grid.dp_group, grid.dp_ranks, grid.dp_rank, grid.mbs, grid.m ...
        grid.finish(stage)                                     # the messages finished, the groups destroyed
                                                               # the epilogue (always): recorders unbounded,
                                                               # the instrumentation recorded

The layout is q14's (global rank = dp_rank * pp + pp_rank: a (dp, pp) mesh, comm/mesh.py); the groups are made on
every rank in one order: the pipelines, the data-parallel sets, and with `tied` and more than one stage each
replica's first and last stage. Each replica's stage comes from the same seed, and its first stage reads its own
shard of the data (`data.SHARDS` records which). The answer's raw collectives are refused outside the case's ranks
(comm/collectives.py CASE_RANKS). The kinds of q20 (buckets), q21 (zero) and q22 (fsdp) run on it.
"""
from __future__ import annotations

import contextlib

from lab_src.comm import collectives
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.pipeline import data
from lab_src.pipeline.stage import PipelineStage


class Grid:
    """This rank's place in the grid case and its groups (after the prologue)."""

    def __init__(self, case, ctx, group, tracer, obs):
        cfg = self.cfg = case.config
        self.case, self.ctx, self.group, self.tracer, self.obs = case, ctx, group, tracer, obs
        self.dp_size, self.pp = cfg.dp_size, cfg.num_stages
        self.mesh = Mesh.of(case, ctx)       # (dp, pp): the configuration's degrees (harness/settings.py GridSettings)
        coords = self.mesh.coords()
        self.dp_rank, self.pp_rank = coords["dp"], coords["pp"]
        self.m = cfg.num_microbatches
        self.mbs = cfg.global_batch_size // (self.dp_size * self.m)

    def build(self, tied: bool) -> None:
        self.mesh.build("pp", "dp")
        if tied and self.pp > 1:
            self.mesh.add("tied", [sorted({d * self.pp, d * self.pp + self.pp - 1}) for d in range(self.dp_size)])
        self.pipe_group, _ = self.mesh.entry("pp")
        self.dp_group, self.dp_ranks = self.mesh.entry("dp")
        self.tied = self.mesh.entry("tied") if tied and self.pp > 1 else None

    def stage(self, cls=PipelineStage):
        """This rank's stage of its replica's pipeline, its layout observed."""
        stage = cls(self.cfg, self.pp_rank, self.pp, self.mbs, self.ctx.device, self.pipe_group)
        observe.observe_stage(stage, self.obs)
        return stage

    def data_iter(self, stage):
        """This replica's shard of the data, in micro-batches, where `stage` reads it (its first stage)."""
        return iter(data.make_dataloader(self.cfg, self.mbs, dp_rank=self.dp_rank)) if stage.is_first_stage else None

    def finish(self, stage) -> None:
        """Once every step is done: the case's messages finished, then the groups destroyed (nothing in flight)."""
        observe.finish_messages(stage, self.group, self.tracer)
        self.mesh.destroy()


@contextlib.contextmanager
def grid_case(case, ctx, group, tracer, obs, *, tied: bool = False, record_shards: bool = False):
    grid = Grid(case, ctx, group, tracer, obs)
    data.SHARDS.clear()
    obs["grid"], obs["micro_batch_size"] = [grid.dp_size, grid.pp], grid.mbs
    try:
        with collectives.bounded(range(case.stages)):
            grid.build(tied)
            yield grid
    finally:
        if record_shards:
            obs["shards"] = [list(s) for s in data.SHARDS]
        observe.record_instrumentation(obs, tracer)
