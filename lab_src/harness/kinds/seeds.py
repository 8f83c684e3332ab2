"""Kind "seeds": a demonstration for q01: weights made with the same seed, or a seed that depends on the
rank, and which samples a data-parallel replica reads first."""
from __future__ import annotations

import torch

from lab_src.harness.case import Case
from lab_src.pipeline import model


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    seed, rank = cfg.seed, ctx.rank

    def fingerprint(t: torch.Tensor) -> list[float]:
        return [round(float(x), 4) for x in t.reshape(-1)[:3]]

    torch.manual_seed(seed)
    same = torch.randn(cfg.hidden_size, cfg.hidden_size // cfg.num_stages)
    torch.manual_seed(seed + rank)
    offset = torch.randn(cfg.hidden_size, cfg.hidden_size // cfg.num_stages)
    block = model.build_piece(cfg, "blocks.3")
    # which samples a data-parallel replica reads first: a shuffle of its own, or its slice of a shared one
    samples = 4 * cfg.global_batch_size
    torch.manual_seed(seed)
    data_same = torch.randperm(samples)[:3]
    shared = torch.randperm(samples, generator=torch.Generator().manual_seed(seed))
    data_split = shared[rank::cfg.num_stages][:3]
    obs.update({"same_seed": fingerprint(same), "rank_seed": fingerprint(offset),
                "block3": fingerprint(block.qkv.weight.detach()),
                "data_same": [int(i) for i in data_same], "data_split": [int(i) for i in data_split]})
