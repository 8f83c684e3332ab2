# q18: proj's own all-reduce over the default group: right while the job is one tensor-parallel group, wrong in a t x p grid
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from lab_src.pipeline import dropout


def tp_block(block, tp, q17):
    """This rank's part of the block: attention split by heads, the MLP of q17, LayerNorms replicated."""
    return TensorParallelBlock(block, tp, q17)


def grouped_by_heads(qkv, t):
    """qkv (3h -> h rows: q, k, v) with its rows reordered so that the r-th of t contiguous chunks holds
    shard r's q rows, then its k rows, then its v rows: the layout a column-parallel layer cuts."""
    h = qkv.in_features
    w, b = (p.detach().split(h, dim=0) for p in (qkv.weight, qkv.bias))
    out = nn.Linear(h, 3 * h, dtype=qkv.weight.dtype, device=qkv.weight.device)
    with torch.no_grad():
        out.weight.copy_(torch.cat([torch.cat([part.chunk(t, 0)[r] for part in w]) for r in range(t)]))
        out.bias.copy_(torch.cat([torch.cat([part.chunk(t, 0)[r] for part in b]) for r in range(t)]))
    return out


class SumHeads(torch.autograd.Function):
    """The heads' partial sums added up: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous().clone()
        dist.all_reduce(x)              # no group: every rank of the job
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ProjByHeads(nn.Module):
    """proj's columns of this rank's heads; the bias whole, added once."""

    def __init__(self, proj, tp):
        super().__init__()
        self.weight = nn.Parameter(proj.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())
        self.bias = nn.Parameter(proj.bias.detach().clone())

    def forward(self, x):
        return SumHeads.apply(F.linear(x, self.weight)) + self.bias


class TensorParallelBlock(nn.Module):
    def __init__(self, block, tp, q17):
        super().__init__()
        self.tp, self.heads, self.p = tp, block.num_heads // tp.size, block.dropout
        self.attn_norm = copy.deepcopy(block.attn_norm)
        self.mlp_norm = copy.deepcopy(block.mlp_norm)
        self.qkv = q17.ColumnParallelLinear(grouped_by_heads(block.qkv, tp.size), tp)
        self.proj = ProjByHeads(block.proj, tp)
        self.mlp = q17.tp_layers(block.up, block.down, tp)
        self.shared = dropout.stream(block.seed, block.name)                 # the same on every rank
        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only

    def forward(self, x):
        b, s, h = x.shape
        drop = self.p > 0 and self.training
        q, k, v = self.qkv(self.attn_norm(x)).split(h // self.tp.size, dim=-1)
        q, k, v = (z.view(b, s, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        mask = dropout.keep(self.own, (b, self.heads, s, s), self.p, x) if drop else None
        attn = dropout.attention(q, k, v, mask)
        a = self.proj(attn.transpose(1, 2).reshape(b, s, h // self.tp.size))
        if drop:
            a = a * dropout.keep(self.shared, a.shape, self.p, a)
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if drop:
            m = m * dropout.keep(self.shared, m.shape, self.p, m)
        return x + m


def predicted_bytes():
    """Bytes one training step of the digits model moves, summed over all ranks (numbers only):
    "tensor_parallel" with t = 2 (no pipeline), "pipeline" with p = 2 stages (no tensor parallelism)."""
    return {"tensor_parallel": 4 * 4 * 2 * (32 * 64 * 32 * 4),    # blocks x all-reduces x ranks x activation
            "pipeline": 2 * 4 * (8 * 64 * 32 * 4)}                 # (forward + back) x micro-batches x activation
