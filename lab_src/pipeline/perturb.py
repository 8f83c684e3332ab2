"""A change the lab makes to a built model, which an honest pipeline must carry to its output.

In every case of 2 stages or more of q08's, q12's and q15's hidden tests, rank 0 changes its stage's position
embedding right after the stage is built, by an amount drawn from a seed only rank 0 knows (os.urandom,
never journalled or sent to another rank before the step ends), and reports the seed in its observations. The judge builds the
whole model, makes the same change, and compares the pipeline's outputs and gradients with that baseline:
a last stage that ignores the activation it receives and rebuilds the earlier stages from the
configuration's seed computes the unchanged model's outputs, and is told so (judge/compare.py
`check_depends`). The change is drawn in float32 on the CPU and then cast, so the rank and the judge add
exactly the same numbers whatever the dtype or device.
"""
from __future__ import annotations

import os

import torch

SCALE = 0.5     # large beside the position embedding's own spread (about 1): the outputs move visibly


def new_seed() -> int:
    return int.from_bytes(os.urandom(4), "little")


def perturb_embedding(embed, seed: int) -> None:
    """Add seed-drawn noise to `embed.positions.weight` (model.Embedding), in place."""
    weight = embed.positions.weight
    g = torch.Generator().manual_seed(int(seed))
    noise = torch.randn(tuple(weight.shape), generator=g, dtype=torch.float32) * SCALE
    with torch.no_grad():
        weight.add_(noise.to(device=weight.device, dtype=weight.dtype))
