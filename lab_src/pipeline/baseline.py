"""The unsharded baseline: the whole model, one batch, one forward and backward (exercise q04).

The baseline is what every pipelined run is compared with. It is computed once per configuration,
outside the pipeline ranks (so that those ranks build only their own layers), and kept in memory by the
process that judges; it is saved to a file only for ranks that load it (q09's and q10's probes).
harness/baselines.py does that bookkeeping for checks, hidden tests, the grader and the tests.
"""
from __future__ import annotations

from pathlib import Path

import torch

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.data import make_dataloader
from lab_src.exercises import baseline_step
from lab_src.pipeline.model import build_model
from lab_src.pipeline.perturb import perturb_embedding


def compute_baseline(cfg: LabConfig, device="cpu", perturbed: int | None = None) -> dict:
    """Run `baseline_step` (q04) on a freshly built whole model: its output, loss and gradients.
    `perturbed`: the seed of the change the lab made to stage 0's embedding in the case (pipeline/perturb.py)."""
    model = build_model(cfg, device)
    if perturbed is not None:
        perturb_embedding(model.embed, perturbed)
    output, loss = baseline_step(model, make_dataloader(cfg, cfg.global_batch_size), device)
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"q04: baseline_step must return (output, loss) with output a tensor, got {type(output).__name__}")
    return {
        "config": cfg.to_dict(),
        "output": output.detach().to("cpu").clone(),
        "loss": float(loss.detach() if isinstance(loss, torch.Tensor) else loss),
        # every name of every parameter: a tied weight appears under both of its names (embed.tokens.weight,
        # head.proj.weight), the one gradient of both uses, which each stage's copy must end up with
        "grads": {name: (p.grad.detach().to("cpu").clone() if p.grad is not None else None)
                  for name, p in model.named_parameters(remove_duplicate=False)},
    }


def save_baseline(baseline: dict, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(baseline, path)
    return path


def load_baseline(path: Path) -> dict:
    return torch.load(path, weights_only=True)
