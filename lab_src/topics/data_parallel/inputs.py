"""The tensors a ring case sums: drawn from the case's seed, the length and the rank's position, so that the
ranks (kind.py) and the judge (judge.py) make the same ones and none of them travels.

Magnitudes spread over six orders (a normal times 10**u, u uniform in [-3, 3]), so that float addition is
visibly not associative: adding the same n tensors in another order changes the last bits of most
elements, which is how the judge tells a ring whose ranks each add in their own order.
"""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def tensor_of(seed: int, length: int, position: int, dtype: str = "float32") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + length * 7919 + position * 104_729)
    x = torch.randn(length, generator=g, dtype=torch.float64)
    x *= 10.0 ** (6 * torch.rand(length, generator=g, dtype=torch.float64) - 3)
    return x.to(DTYPES[dtype])


def expected_sum(seed: int, length: int, n: int, dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """(the exact sum in float64 of the n inputs as the ranks hold them, the sum of their absolute values)."""
    xs = [tensor_of(seed, length, j, dtype).double() for j in range(n)]
    return sum(xs), sum(x.abs() for x in xs)
