"""What q23's sequence-parallel kinds and judge share at run time (with torch): what a rank is given, the block's
inputs, the rows of a rank's heads, the block's configuration. q18's (topics/tensor_parallel/runtime.py and records.py)
written again here, not imported: a topic stands at most two floors above the core (tests/test_topics.py), and
tensor_parallel stands on training already.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import piece_seed

BLOCK = "blocks.0"          # the block a case splits
# AdamW's eps in the sequence-parallel training, on the ranks and in one process alike: q18's (topics/tensor_parallel/
# records.py ADAM_EPS says why torch's 1e-8 lets a gradient that is zero but for rounding move a parameter by +-lr)
ADAM_EPS = 1e-4


@dataclass(frozen=True)
class TensorParallel:
    """What one rank of the tensor-parallel (here also sequence-parallel) group is given, as in q17 and q18."""
    rank: int
    size: int
    group: object
    device: torch.device

    def __repr__(self) -> str:
        return f"TensorParallel(rank={self.rank}, size={self.size})"


def block_config(cfg: LabConfig, t: int, dropout: float = 0.0) -> LabConfig:
    """`cfg` with the block's dropout, its attention masks drawn per shard of t (pipeline/dropout.py)."""
    return cfg.replace(dropout=dropout, dropout_shards=t if dropout else 1)


def block_inputs(cfg: LabConfig) -> dict:
    """The whole input x (b, s, h) of a case and the gradient of the block's output, from the seed alone."""
    b, s, h = cfg.global_batch_size // cfg.num_microbatches, cfg.seq_len, cfg.hidden_size
    gen = torch.Generator().manual_seed(piece_seed(cfg.seed, "q23-sp-inputs"))
    return {name: torch.randn(b, s, h, generator=gen, dtype=torch.float64).to(cfg.torch_dtype)
            for name in ("x", "grad")}


def heads_rows(h: int, heads: int, rank: int, t: int) -> torch.Tensor:
    """The rows of the block's qkv weight (q's h rows, then k's, then v's) that hold the heads of shard `rank` of t."""
    per = h // t
    return torch.cat([torch.arange(part * h + rank * per, part * h + (rank + 1) * per) for part in range(3)])
