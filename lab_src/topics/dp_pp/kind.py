"""Kind "grid" (q14): the student's step on a data-parallel x pipeline-parallel grid of all the case's
ranks, and what it observed.

The rank hands the student's `dp_pp_step` a `Grid` (topics/dp_pp/grid.py) and the configuration, and
records, whatever happens: the groups the step created, the shards it read, every event (forward,
backward, messages and all-reduces). When the step returns its stage, the rank also records which stage
it is and in which pipeline group, its outputs, loss and gradients, and then takes one SGD step and
records its copy of the tied embedding: the judge (topics/dp_pp/judge.py) checks that the copies stayed equal.

With the probe "network", rank 0 and rank 1 then time a few messages of two sizes between them (a
ping-pong through the run's world group): the latency and bandwidth of this machine's collective library,
which the traffic model (topics/dp_pp/network.py) predicts with.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import data, trace, waiting
from lab_src.topics.dp_pp.grid import Grid
from lab_src.pipeline.stage import PipelineStage

SGD_LR = 0.1     # the one optimizer step after which the tied copies are compared


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    data.SHARDS.clear()
    grid = Grid(ctx.rank, case.stages, cfg.dp_size, cfg.num_stages, ctx.device, ctx.timeout_s)
    obs["grid"] = [cfg.dp_size, cfg.num_stages]
    try:
        observe.barrier(group)
        returned = exercises.dp_pp_step(grid, cfg)
        stage = _unpack(returned, obs)
        observe.finish_messages(stage, group, tracer)
        if stage is not None:
            _observe_stage(stage, obs)
        grid.close()                    # every rank is past the step: nothing is in flight on its groups
        if "network" in case.probes:
            with trace.tracing(None):   # the lab's own ping-pong: not part of the student's run (comm/messages.py records raw calls)
                obs["link"] = measure_link(ctx.rank, group, ctx.device)
    finally:
        obs["groups_created"] = [list(g) for g in grid.created]
        obs["shards"] = [list(s) for s in data.SHARDS]
        observe.record_instrumentation(obs, tracer)


def _unpack(returned, obs) -> PipelineStage | None:
    """The stage of `(stage, outputs, loss)`; outputs and loss into `obs`. A malformed return is noted."""
    try:
        stage, outputs, loss = returned
    except (TypeError, ValueError):
        obs["returned"] = f"dp_pp_step must return (stage, outputs, loss); it returned {observe.plain(returned)!r}"[:500]
        return None
    if not isinstance(stage, PipelineStage):
        obs["returned"] = f"the first thing dp_pp_step returns must be its PipelineStage, got {observe.plain(stage)!r}"[:500]
        return None
    if isinstance(outputs, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in outputs):
        obs["outputs"] = [o.detach().cpu().clone() for o in outputs]
    else:
        obs["returned"] = f"outputs must be a list of tensors, got {observe.plain(outputs)!r}"[:500]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        loss = float(loss)
    obs["loss"] = float(loss) if isinstance(loss, (int, float)) and not isinstance(loss, bool) else None
    return stage


def _observe_stage(stage: PipelineStage, obs: dict) -> None:
    obs["pp_rank"], obs["pp_size"] = stage.pp_rank, stage.pp_size
    obs["pipeline_group"] = dist.get_process_group_ranks(stage.group) if stage.group is not None else None
    observe.observe_stage(stage, obs)
    obs["grads"] = observe.gradients(stage)
    obs["weights"] = {n: float(p.detach().double().sum()) for n, p in stage.named_parameters()}   # before the step
    with torch.no_grad():
        for p in stage.parameters():
            if p.grad is not None:
                p -= SGD_LR * p.grad
    tied = stage.tied_embedding
    obs["tied_after_step"] = tied.detach().cpu().clone() if tied is not None else None


def measure_link(rank: int, group, device="cpu", sizes=(4, 1 << 20), repeats: int = 5) -> dict | None:
    """Rank 0 and rank 1 bounce messages of each size; half the best round trip is one message's time.
    Returns {bytes: seconds} on rank 0 (None elsewhere). Every rank of `group` takes part in the barriers."""
    out = {}
    for nbytes in sizes:
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
        best = float("inf")
        waiting.barrier(group)
        for _ in range(repeats):
            if rank == 0:
                t0 = time.perf_counter()
                dist.send(buf, dst=1)
                dist.recv(buf, src=1)
                best = min(best, (time.perf_counter() - t0) / 2)
            elif rank == 1:
                dist.recv(buf, src=0)
                dist.send(buf, dst=0)
        out[buf.numel() * 4] = best
    waiting.barrier(group)
    return {str(k): v for k, v in out.items()} if rank == 0 else None
