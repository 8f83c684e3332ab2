"""Dropout in the lab's block (q18), defined so that a tensor-parallel run can reproduce it exactly.

Off by default (`cfg.dropout` = 0.0): the block runs as it always did, and nothing draws a random number.
On, in training mode only, a block drops in three places:

    attention   the attention probabilities, (b, heads, s, s): inside the sharded region (q18 splits heads)
    residual    the attention's output projection, (b, s, h), before its residual add: outside (replicated)
    mlp         the MLP's output, (b, s, h), before its residual add: outside (replicated)

The masks come from streams (`torch.Generator`s on the CPU), one set per block, named by the run's seed
and the block's name, never by the global RNG:

    stream(seed, name)            the shared stream: what every tensor-parallel rank draws the same from
    stream(seed, name, shard=j)   shard j's own stream: the attention mask of the heads of shard j of t

**The single-process definition.** A block of `cfg.dropout_shards` = t draws, in each training forward:
for j = 0..t-1 the attention mask of the heads of shard j (the j-th of t contiguous groups of heads,
shape (b, heads/t, s, s)) from shard j's stream, concatenated along the heads; then the residual mask,
then the mlp mask, both (b, s, h), from the shared stream. A tensor-parallel rank r that draws its own
heads' mask from shard r's stream and the two outside masks from the shared stream draws exactly the
same numbers: undo the sharding and it is the single process's mask, element for element.

A mask keeps an element where a uniform draw (float32, on the CPU) is at least p and scales it by
1/(1 - p); `keep(gen, shape, p, like)` draws one, as `like`'s dtype and device.
"""
from __future__ import annotations

import hashlib
import math

import torch
import torch.nn.functional as F


def stream(seed: int, name: str, shard: int | None = None) -> torch.Generator:
    """The stream of block `name`'s dropout: shared by every rank (shard None) or shard `shard`'s own, seeded
    from sha256("<seed>/<name>/dropout/<shared or shard j>") as model.py seeds its pieces."""
    tag = "shared" if shard is None else f"shard{int(shard)}"
    digest = hashlib.sha256(f"{seed}/{name}/dropout/{tag}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:4], "little"))


def keep(gen: torch.Generator, shape, p: float, like: torch.Tensor) -> torch.Tensor:
    """A dropout mask of `shape`: 1/(1-p) where kept, 0 where dropped (drawn on the CPU in float32)."""
    u = torch.rand(tuple(shape), generator=gen, dtype=torch.float32)
    return ((u >= p).to(torch.float64) / (1.0 - p)).to(dtype=like.dtype, device=like.device)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of (b, heads, s, d) q, k, v; with `mask` (b, heads, s, s), the probabilities are
    multiplied by it (dropout) before they weigh v. Without one: torch's scaled_dot_product_attention."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)     # torch's kernel: no dropout to apply
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    return (probs * mask) @ v


class Streams:
    """A single-process block's streams: the shared one and each of its t shards' own."""

    def __init__(self, seed: int, name: str, shards: int):
        self.shared = stream(seed, name)
        self.shards = [stream(seed, name, j) for j in range(shards)]

    def attention_mask(self, shape, p: float, like: torch.Tensor) -> torch.Tensor:
        b, heads, s, _ = shape
        t = len(self.shards)
        if heads % t:
            raise ValueError(f"{heads} heads do not split into {t} shards")
        return torch.cat([keep(g, (b, heads // t, s, s), p, like) for g in self.shards], dim=1)
