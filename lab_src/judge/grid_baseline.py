"""One process's gradients of a grid case (parent side): what every data x pipeline grid kind's gradients are held to.

    grid_baseline_grads(case, steps, lr)   one dict {parameter name: gradient} per step: the whole model on the
                                           global batch, `.mean()` of its output, then one SGD step of `lr`, `steps`
                                           times; parameters named in the case's setting "freeze" get no gradient

The ranks of q20's buckets and q22's fsdp cases take the same SGD steps on their shards of the same batch, so after
each step their (rebuilt) gradients must equal these, whatever the grid. Computed on the CPU with a rank's threads
(harness/baselines.py), cached per configuration.
"""
from __future__ import annotations

import functools

import torch

from lab_src.harness.settings import settings_of

SGD_LR = 0.1   # the grid kinds' SGD step (topics/data_parallel/kind_buckets.py, topics/sharding/kind_fsdp.py)


@functools.lru_cache(maxsize=16)
def _baseline(cfg_items: tuple, freeze: tuple, steps: int, lr: float) -> list[dict]:
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    cfg = LabConfig(**dict(cfg_items))
    model = build_model(cfg, "cpu")
    for name, p in model.named_parameters():
        if name in freeze:
            p.requires_grad_(False)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    out = []
    for _ in range(steps):
        for p in model.parameters():
            p.grad = None
        model(batch).mean().backward()
        out.append({n: p.grad.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)
                    if p.grad is not None})
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
    return out


def grid_baseline_grads(case, steps: int, lr: float = SGD_LR) -> list[dict]:
    """One process's gradients at each of `steps` steps: the whole model, the global batch, SGD steps of `lr`."""
    from lab_src.harness.baselines import threads_of_a_rank
    with threads_of_a_rank():
        return _baseline(tuple(sorted(case.config.to_dict().items())), tuple(getattr(settings_of(case), "freeze", ())),
                         steps, lr)
