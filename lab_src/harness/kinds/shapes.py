"""Kind "shapes": the activation shape (q03) tried without a stage (q05 may not be written yet): rank 0
embeds a micro-batch of tokens, every other rank runs one block on a tensor of the answer's activation
shape, and the last also runs the head."""
from __future__ import annotations

import torch

from lab_src import exercises
from lab_src.harness.case import Case
from lab_src.harness.observe import attempt, micro_batch_size, plain
from lab_src.pipeline import data, model


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    mbs = obs["micro_batch_size"] = micro_batch_size(cfg)
    shape = obs["activation_shape"] = plain(exercises.activation_shape(cfg, mbs))
    dtype = cfg.torch_dtype
    if ctx.rank == 0:
        tokens = next(iter(data.make_dataloader(cfg, mbs)))
        obs["embed"] = attempt(model.build_piece(cfg, "embed"), tokens)
    else:
        try:
            x = torch.randn(*shape, dtype=dtype)
        except Exception:  # noqa: BLE001 - the answer's shape is not a shape at all
            obs["block"] = {"outcome": "raised", "type": "TypeError", "message": f"no tensor has the shape {shape!r}"}
            return
        obs["block"] = attempt(model.build_piece(cfg, f"blocks.{ctx.rank % cfg.num_layers}"), x)
        if ctx.rank == cfg.num_stages - 1:
            obs["head"] = attempt(model.build_piece(cfg, "head"), x)
