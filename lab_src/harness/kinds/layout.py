"""Kind "layout": each rank builds its stage, which observes the micro-batch size (q02), the activation
shape (q03) and the layers (q05); with "q06" among the case's calls, the rank also feeds the stage what
the answer to q06 says it gets: tokens from the dataloader when it needs one, else an activation from
the previous stage."""
from __future__ import annotations

import torch

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import data


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        obs["parameters"] = sum(p.numel() for p in stage.parameters())
        if "q06" in case.calls:
            needs = exercises.needs_dataloader(ctx.rank, cfg.num_stages)
            obs["needs_dataloader"] = observe.plain(needs)
            if needs:
                x = next(iter(data.make_dataloader(cfg, obs["micro_batch_size"]))).to(ctx.device)
            else:
                x = torch.randn(stage.activation_shape, dtype=stage.dtype, device=ctx.device)
            obs["feed"] = observe.attempt(stage.forward, x)
    finally:
        observe.record_instrumentation(obs, tracer)
