"""Kind "torch": torch.distributed.pipelining's Schedule1F1B on the stages the student's step runs on (the
lab's PipelineStage, built from the student's layout answers, wrapped for torch by pipeline/torch_bridge.py),
for the notebooks' bridge to the production API (checks/torch_bridge.py). Ungraded: nothing judges it.

Each rank records the forwards and backwards torch's schedule ran, with their micro-batches and times
(compute only: torch's own messages are not traced), from the calls the schedule makes to its stage
(`forward_one_chunk`, `backward_one_chunk`): what torch ran, not its plan (`pipeline_order`, whose last rank
is numbered from micro-batch 1 in torch 2.13). torch's step runs outside the tracer, so that the lab's recorders of raw
point-to-point calls (harness/rawp2p.py) leave torch's messages alone.
"""
from __future__ import annotations

import time

from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import data, trace
from lab_src.pipeline.torch_bridge import mean_loss, stage_modules
from lab_src.pipeline.trace import Event


def _recorded(method, kind: str, events: list, rank: int):
    """torch's stage method for one micro-batch's forward (or backward), recording it as a lab Event."""
    def wrapper(chunk_id, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return method(chunk_id, *args, **kwargs)
        finally:
            events.append(Event(rank, kind, chunk_id, None, None, 0, t0, time.perf_counter()))
    return wrapper


def run(case: Case, ctx, group, tracer, obs) -> None:
    import torch
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import Schedule1F1B

    cfg = case.config
    rank, p, m = ctx.rank, cfg.num_stages, cfg.num_microbatches
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        theirs = TorchStage(stage_modules(stage), rank, p, ctx.device, group=group)
        schedule = Schedule1F1B(theirs, n_microbatches=m, loss_fn=mean_loss)
        theirs.forward_one_chunk = _recorded(theirs.forward_one_chunk, "forward", tracer.events, rank)
        theirs.backward_one_chunk = _recorded(theirs.backward_one_chunk, "backward", tracer.events, rank)
        batch = next(iter(data.make_dataloader(cfg, cfg.global_batch_size))).to(ctx.device)
        observe.barrier(group)
        with trace.tracing(None):
            if rank == 0:
                schedule.step(batch)
            elif rank == p - 1:
                schedule.step(target=torch.zeros(cfg.global_batch_size), losses=[])
            else:
                schedule.step()
        observe.finish_messages(None, group, tracer)
    finally:
        observe.record_instrumentation(obs, tracer)
