"""Kind "torch": torch.distributed.pipelining's Schedule1F1B on the stages the student's step runs on (the
lab's PipelineStage, built from the student's layout answers, wrapped for torch by topics/interleaved/torch_bridge.py),
or, for a case of an interleaved schedule ("interleaved:<v>"), ScheduleInterleaved1F1B on the chunks of the
lab's InterleavedStage; for the notebooks' bridge to the production API (checks/torch_bridge.py). Ungraded: nothing judges it.

Each rank records the forwards and backwards torch's schedule ran, with their micro-batches and times
(compute only: torch's own messages are not traced), from the calls the schedule makes to its stage
(`forward_one_chunk`, `backward_one_chunk`): what torch ran, not its plan (`pipeline_order`, whose last rank
is numbered from micro-batch 1 in torch 2.13). torch's step runs outside the tracer, so that the lab's recorders of raw
point-to-point calls (comm/messages.py) leave torch's messages alone.
"""
from __future__ import annotations

import time

from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import data, trace
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event
from lab_src.topics.interleaved.chunked import InterleavedStage
from lab_src.topics.interleaved.torch_bridge import chunk_modules, mean_loss, stage_modules


def _recorded(method, kind: str, events: list, rank: int, chunk: int = 0):
    """torch's stage method for one micro-batch's forward (or backward), recording it as a lab Event."""
    def wrapper(mb, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(mb, *args, **kwargs)
        finally:
            events.append(Event(rank, kind, mb, None, None, 0, t0, time.perf_counter(), chunk))
    return wrapper


def _torch_schedule(case: Case, ctx, group, obs):
    """torch's schedule of the case on this rank's stage (or chunks), and their torch stages."""
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B, ScheduleInterleaved1F1B
    cfg, rank, p = case.config, ctx.rank, case.config.num_stages
    v = schedule(case.schedule).chunks_per_rank
    if not case.schedule.startswith("interleaved"):
        stage = observe.build_stage(cfg, ctx, group, obs)
        theirs = [TorchStage(stage_modules(stage), rank, p, ctx.device, group=group)]
        return Schedule1F1B(theirs[0], n_microbatches=cfg.num_microbatches, loss_fn=mean_loss), theirs
    stage = InterleavedStage(cfg, rank, p, v, observe.micro_batch_size(cfg), ctx.device, group)
    theirs = [TorchStage(chunk_modules(stage, c), stage.virtual_stage(c), v * p, ctx.device, group=group)
              for c in range(v)]
    return ScheduleInterleaved1F1B(theirs, n_microbatches=cfg.num_microbatches, loss_fn=mean_loss), theirs


def run(case: Case, ctx, group, tracer, obs) -> None:
    import torch

    cfg = case.config
    rank, p = ctx.rank, cfg.num_stages
    try:
        torch_schedule, theirs = _torch_schedule(case, ctx, group, obs)
        for c, t in enumerate(theirs):
            t.forward_one_chunk = _recorded(t.forward_one_chunk, "forward", tracer.events, rank, c)
            t.backward_one_chunk = _recorded(t.backward_one_chunk, "backward", tracer.events, rank, c)
        batch = next(iter(data.make_dataloader(cfg, cfg.global_batch_size))).to(ctx.device)
        observe.barrier(group)
        with trace.tracing(None):
            if rank == 0:
                torch_schedule.step(batch)
            elif rank == p - 1:
                torch_schedule.step(target=torch.zeros(cfg.global_batch_size), losses=[])
            else:
                torch_schedule.step()
        observe.finish_messages(None, group, tracer)
    finally:
        observe.record_instrumentation(obs, tracer)
