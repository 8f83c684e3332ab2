"""Tensor parallelism (q17): what one rank of a tensor-parallel group is given, and the numbers its cases
run on.

    tp.rank, tp.size          this rank's place in the tensor-parallel group, and the group's size t
    tp.group                  the process group of the t ranks (for torch.distributed's collectives)
    tp.device                 where this rank computes

The student's answer (the q17 answer cell) splits the MLP of one block of the lab's model
(pipeline/model.py: `down(gelu(up(x)))`, `up` hidden -> 4 hidden, `down` 4 hidden -> hidden) over the t
ranks: rank r holds the r-th of t equal contiguous slices (`torch.chunk`) of `up`'s output features
(column parallel) and of `down`'s input features (row parallel).

`inputs(cfg, t)` draws, from the configuration's seed alone, every tensor a q17 case feeds the answer:
the rank (topics/tensor_parallel/kind_layers.py) and the judging process (topics/tensor_parallel/judge_layers.py) draw the same ones, so the judge
computes what each rank should have got without trusting anything the rank wrote but its results.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import build_piece, piece_seed

BLOCK = "blocks.0"          # the block whose MLP every q17 case splits


@dataclass(frozen=True)
class TensorParallel:
    rank: int
    size: int
    group: object
    device: torch.device

    def __repr__(self) -> str:
        return f"TensorParallel(rank={self.rank}, size={self.size})"


def full_mlp(cfg: LabConfig, device="cpu"):
    """The unsharded `up` and `down` of the block every case splits (the same weights on every rank)."""
    block = build_piece(cfg, BLOCK, device)
    return block.up, block.down


def batch_shape(cfg: LabConfig) -> tuple[int, int, int]:
    return (cfg.global_batch_size // cfg.num_microbatches, cfg.seq_len, cfg.hidden_size)


def inputs(cfg: LabConfig, t: int) -> dict:
    """The tensors of a case of `cfg` on `t` ranks, drawn from the configuration's seed:
        x          (b, s, h)      the MLP's input, the same on every rank
        grad       (b, s, h)      the gradient of the MLP's (and the row layer's) output, the same on every rank
        col_grad   (b, s, 4h)     the gradient of the full `up` output; rank r's column layer gets its slice
        copy_grads [t x (b, s, h)] each rank's gradient of the copy's output (they differ)
        parts      [t x (b, s, h)] each rank's input to the reduce (they differ)
    """
    b, s, h = batch_shape(cfg)
    gen = torch.Generator().manual_seed(piece_seed(cfg.seed, "q17-inputs"))

    def draw(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(cfg.torch_dtype)
    return {"x": draw(b, s, h), "grad": draw(b, s, h), "col_grad": draw(b, s, 4 * h),
            "copy_grads": [draw(b, s, h) for _ in range(t)], "parts": [draw(b, s, h) for _ in range(t)]}


def hidden_activation(cfg: LabConfig, x: torch.Tensor) -> torch.Tensor:
    """gelu(up(x)) of the full layer: what the row-parallel layer's ranks each get a slice of."""
    up, _ = full_mlp(cfg)
    with torch.no_grad():
        return F.gelu(up(x))


def shard(tensor: torch.Tensor, rank: int, t: int, dim: int) -> torch.Tensor:
    """Rank `rank`'s slice of `tensor` along `dim`, of t equal contiguous slices."""
    return torch.chunk(tensor, t, dim=dim)[rank]


# ---- q18: the whole block (its configurations: records.py) -------------------------------------------
def block_inputs(cfg: LabConfig) -> dict:
    """The input x (b, s, h) of a q18 block case and the gradient of its output, from the seed alone."""
    b, s, h = batch_shape(cfg)
    gen = torch.Generator().manual_seed(piece_seed(cfg.seed, "q18-inputs"))
    return {name: torch.randn(b, s, h, generator=gen, dtype=torch.float64).to(cfg.torch_dtype)
            for name in ("x", "grad")}


def heads_rows(h: int, heads: int, rank: int, t: int) -> torch.Tensor:
    """The rows of the block's qkv weight (3h x h: q's rows, then k's, then v's) that hold the heads of
    shard `rank` of t: its q rows, then its k rows, then its v rows."""
    per = h // t
    return torch.cat([torch.arange(part * h + rank * per, part * h + (rank + 1) * per) for part in range(3)])
