"""What q24's kind (kind_attention.py) and judge (judge_attention.py) share, with torch: a run's tensors drawn from the
case's seed, the padding and the shards of each layout, the single-process answer (torch's
scaled_dot_product_attention), and the lab's count of what a rank computed.

    tensors(run, seed, index, batch, dtype, perturbed)   q, k, v and the output's gradient, whole (b, H, S, D)
    shard(x, rank, n, layout)      a rank's rows of a padded tensor (records.py `positions`)
    unshard(shards, n, layout)     the whole padded tensor from every rank's rows
    single(q, k, v, dout, causal)  the output and dq, dk, dv of one process, autograd through torch's SDPA
    Work                           a dispatch mode that times every matmul the rank ran and counts its FLOPs
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from lab_src.topics.long_sequences.records import padded, positions

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16}


def tensors(run: dict, seed: int, index: int, batch: int, dtype: str, perturbed: int | None = None) -> list:
    """q, k, v and the output's gradient of run `index` of a case, (b, H, S, D) each, drawn from the case's seed;
    changed by noise from `perturbed` (a seed drawn outside the answer) when given."""
    g = torch.Generator().manual_seed(1_000_003 * seed + 7919 * index + run["seq"])
    shape = (batch, run["heads"], run["seq"], run["dim"])
    xs = [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(4)]
    if perturbed is not None:
        h = torch.Generator().manual_seed(perturbed + index)
        xs = [x + 0.25 * torch.randn(shape, generator=h, dtype=torch.float64) for x in xs]
    return [x.to(DTYPES[dtype]) for x in xs]


def layout_of(run: dict) -> str:
    return run.get("layout", "contiguous") if run["fn"] == "ring" else "contiguous"


def pad(x: torch.Tensor, n: int, layout: str) -> torch.Tensor:
    extra = padded(x.shape[-2], n, layout) - x.shape[-2]
    return F.pad(x, (0, 0, 0, extra)) if extra else x


def shard(x: torch.Tensor, rank: int, n: int, layout: str) -> torch.Tensor:
    """Rank `rank`'s rows of the padded tensor x, in the order it holds them."""
    rows = x.shape[-2] // n
    return x[..., positions(rank, n, rows, layout), :].contiguous()


def unshard(shards: dict, n: int, layout: str, like: torch.Tensor) -> torch.Tensor | None:
    """The whole padded tensor from each rank's rows ({rank: tensor}); None when a shard is missing or misshapen."""
    rows = like.shape[-2] // n
    out = torch.zeros_like(like)
    for r in range(n):
        t = shards.get(r)
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(like.shape[:-2]) + (rows, like.shape[-1]):
            return None
        out[..., positions(r, n, rows, layout), :] = t.to(like.dtype)
    return out


def single(q, k, v, dout, causal: bool) -> list[torch.Tensor]:
    """One process's output and gradients: torch's scaled_dot_product_attention, autograd."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    o.backward(dout)
    return [o.detach(), q.grad, k.grad, v.grad]


class Work(TorchDispatchMode):
    """Every matmul run under it, [start, end, FLOPs] (torch.utils.flop_counter's formulas): what the rank computed,
    read by the lab, never reported by the answer."""

    def __init__(self):
        super().__init__()
        self.matmuls: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        t0 = time.perf_counter()
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            try:
                flops = int(formula(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 - a formula that cannot read these arguments counts nothing
                flops = 0
            if flops:
                self.matmuls.append([t0, time.perf_counter(), flops])
        return out

    @property
    def flops(self) -> int:
        return sum(m[2] for m in self.matmuls)
