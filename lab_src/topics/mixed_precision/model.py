"""The pieces of a q26 case both sides build alike (torch): the blocks, each step's batch and loss, and one
process's step with the same casts (what the judge compares with).

    blocks(cfg, settings)               the case's blocks, the same on every rank and in the judge
    flat_of(block), layout_of(block)    a block's flattened parameters (named_parameters order), and their places
    batch(cfg, settings, step, replica) (x, target): one replica's sequences of a step, float32
    loss_of(y, target)                  the mean squared error, float32
    replica_grads(...)                  one process's gradients of one replica's loss, with the answer's casts
    one_step(...)                       one process's step of the whole group from given float32 masters
"""
from __future__ import annotations

import torch
from torch.func import functional_call

from lab_src.pipeline.model import Block

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def blocks(cfg, settings) -> list[Block]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        return [Block(cfg, i).float() for i in range(settings.blocks)]


def flat_of(block) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in block.parameters()]).float()


def layout_of(block) -> list[tuple[str, tuple, int]]:
    return [(name, tuple(p.shape), p.numel()) for name, p in block.named_parameters()]


def views(full: torch.Tensor, layout) -> dict:
    """{parameter name: its view of the flat vector `full`}, in the layout's order."""
    pieces = torch.split(full, [count for _, _, count in layout])
    return {name: piece.view(shape) for (name, shape, _), piece in zip(layout, pieces)}


def batch(cfg, settings, step: int, replica: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(cfg.seed * 100_003 + step * 257 + replica)
    shape = (settings.batch, cfg.seq_len, cfg.hidden_size)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def loss_of(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((y.float() - target) ** 2).mean()


def replica_grads(model: list[Block], masters: list[torch.Tensor], x, target, dtype, scale: float = 1.0):
    """One replica's flat gradients (float32, one per block) of its loss times `scale`, each block run in `dtype` on
    its master cast to `dtype` and its input cast to `dtype`, its output returned in float32 (the contract's casts),
    and the loss (float32, unscaled)."""
    fulls, h = [], x
    with torch.enable_grad():
        for block, master in zip(model, masters):
            full = master.detach().to(dtype).requires_grad_()
            fulls.append(full)
            h = functional_call(block, views(full, layout_of(block)), (h.to(dtype),)).float()
        loss = loss_of(h, target)
        grads = torch.autograd.grad(loss * scale, fulls)
    return [g.float() for g in grads], float(loss.detach())


def one_step(cfg, settings, model, masters, step: int, n: int, scale: float):
    """One process's step of the whole group from the float32 `masters`: every replica's gradients (same casts),
    summed in float32 and divided by n ("summed": the scaled mean; "parts": each replica's, for the tolerance),
    whether any is inf or NaN, and the masters after SGD (unchanged on such a step; the lab's inf counted too)."""
    dtype = DTYPES[settings.dtype]
    parts = []
    for replica in range(n):
        x, target = batch(cfg, settings, step, replica)
        parts.append(replica_grads(model, masters, x, target, dtype, scale)[0])
    summed = [torch.stack([p[b] for p in parts]).sum(0) / n for b in range(len(masters))]
    found = any(not torch.isfinite(g).all() for g in summed) or step == settings.inject_step
    if found:
        after = [m.clone() for m in masters]
    else:
        after = [m.clone().add_(g * (1.0 / scale), alpha=-settings.lr) for m, g in zip(masters, summed)]
    return {"summed": summed, "parts": parts, "found": found, "after": after}
