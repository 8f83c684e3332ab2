"""The tensors a ring case sums: drawn from the case's seed, the length and the rank's position, so that the
ranks (kind.py) and the judge (judge.py) make the same ones and none of them travels.

Magnitudes spread over six orders (a normal times 10**u, u uniform in [-3, 3]), so that float addition is
visibly not associative: adding the same n tensors in another order changes the last bits of most
elements, which is how the judge tells a ring whose ranks each add in their own order.

In a hidden case (settings "perturb") each rank changes its input, once drawn, by noise drawn from a seed the
case's rank 0 draws with os.urandom and hands to the case's ranks through the launch's store (kind.py), never
through a message of the answer's: `input_of` with that seed (each element scaled by a factor drawn from it). Rank 0 reports the seed, and the judge draws the
changed inputs here, so a rank that redraws every rank's input from the configuration's seed sums other numbers.
"""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "float64": torch.float64}
# The shortest inputs are left as drawn: a few elements summed in another order can by chance give the same bits,
# and which of them did would then change from one grading to the next (the feedback names the lengths where the
# ranks' bits differ); from 64 elements on, they never do. An answer that redraws the inputs is named on the longer.
PERTURBED_FROM = 64


def tensor_of(seed: int, length: int, position: int, dtype: str = "float32") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + length * 7919 + position * 104_729)
    x = torch.randn(length, generator=g, dtype=torch.float64)
    x *= 10.0 ** (6 * torch.rand(length, generator=g, dtype=torch.float64) - 3)
    return x.to(DTYPES[dtype])


def input_of(seed: int, length: int, position: int, dtype: str = "float32", perturbed: int | None = None) -> torch.Tensor:
    """The input of the rank at `position`: tensor_of's, with `perturbed` (the case's seed drawn outside the answer)
    each element multiplied by a factor in [0.5, 1.5) drawn from it, in float64 and then cast, so that rank and judge
    get the same bits. One uniform draw: a third of what tensor_of's own draw costs."""
    x = tensor_of(seed, length, position, dtype)
    if perturbed is None or length < PERTURBED_FROM:
        return x
    g = torch.Generator().manual_seed(int(perturbed) * 1_000_003 + length * 7919 + position * 104_729)
    factor = torch.rand(length, generator=g, dtype=torch.float64).add_(0.5)
    return (x.double() * factor).to(DTYPES[dtype])


def inputs_of(seed: int, length: int, n: int, dtype: str = "float32", perturbed: int | None = None) -> list[torch.Tensor]:
    """The n inputs of a ring as its ranks hold them, in float64, by position."""
    return [input_of(seed, length, j, dtype, perturbed).double() for j in range(n)]


def expected_sum(seed: int, length: int, n: int, dtype: str = "float32",
                 perturbed: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the exact sum in float64 of the n inputs as the ranks hold them, the sum of their absolute values)."""
    xs = inputs_of(seed, length, n, dtype, perturbed)
    return sum(xs), sum(x.abs() for x in xs)
