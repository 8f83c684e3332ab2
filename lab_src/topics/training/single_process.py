"""The single-process run a pipelined training is compared with (exercise q13): the whole model in one
process, the same seed, the same batches, AdamW, cross-entropy, one optimizer step per batch.

`train_single_process(..., mistake=...)` also trains with one of the usual mistakes of a training
loop, on purpose: the judge compares a wrong pipeline curve with these to say which mistake it
matches (`MISTAKES`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab_src.topics.training.classifier import class_scores
from lab_src.pipeline.config import LabConfig
from lab_src.topics.training.digits import Digits
from lab_src.pipeline.model import build_model
from lab_src.pipeline.perturb import perturb_embedding

# A training loop's usual mistakes, reproduced in one process, and what each means.
MISTAKES = {
    "never_zeroed": "gradients are never zeroed, so every step adds the new gradients to all the old ones: "
                    "call optimizer.zero_grad() once per step, before the step's backward",
    "zeroed_before_update": "gradients are zeroed after the backward and before optimizer.step(), so the "
                            "optimizer never sees them: zero them before the step's backward instead",
    "fresh_optimizer": "a new optimizer is created every step, so AdamW forgets its running averages: create "
                       "it once, before the loop",
    "last_microbatch_only": "gradients are zeroed between micro-batches, so only the last micro-batch's "
                            "gradient reaches the optimizer: zero once per step, the step accumulates the rest",
}


def train_single_process(cfg: LabConfig, data: Digits, num_steps: int, lr: float, mistake: str | None = None,
                         device="cpu", progress=None, perturbed: int | None = None, eps: float = 1e-8) -> dict:
    """Train the whole model for `num_steps` batches of `data`; evaluate it on the held-out images.
    Returns the loss of every step, the held-out loss and accuracy, and the final parameters.
    `progress(step)`, if given, is called after every step. `perturbed`: the seed of the change a hidden case
    made to the embedding once built (pipeline/perturb.py), made here too. `eps`: AdamW's (torch's default; q18's
    trainings use their own, topics/tensor_parallel/records.py ADAM_EPS)."""
    if mistake is not None and mistake not in MISTAKES:
        raise ValueError(f"unknown mistake {mistake!r}; known: {', '.join(MISTAKES)}")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)        # a small model: more threads only wait for each other, more so on a busy machine
    try:
        return _train(cfg, data, num_steps, lr, mistake, device, progress, perturbed, eps)
    finally:
        torch.set_num_threads(threads)


def _train(cfg: LabConfig, data: Digits, num_steps: int, lr: float, mistake: str | None, device, progress,
           perturbed: int | None = None, eps: float = 1e-8) -> dict:
    model = build_model(cfg, device)
    if perturbed is not None:
        perturb_embedding(model.embed, perturbed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
    losses = []
    for k in range(num_steps):
        tokens, labels = (t.to(device) for t in data.batch(k))
        if mistake == "fresh_optimizer":
            optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=eps)
        if mistake != "never_zeroed":
            optimizer.zero_grad()
        if mistake == "last_microbatch_only":
            loss = sum(F.cross_entropy(class_scores(model(t)), y) / data.num_microbatches
                       for t, y in zip(tokens.split(data.micro_batch_size), labels.split(data.micro_batch_size)))
            last = F.cross_entropy(class_scores(model(tokens[-data.micro_batch_size:])), labels[-data.micro_batch_size:])
            last.backward()                 # as a step of one micro-batch computes it
        else:
            loss = F.cross_entropy(class_scores(model(tokens)), labels)
            loss.backward()
        if mistake == "zeroed_before_update":
            optimizer.zero_grad()
        optimizer.step()
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(k)
    test_loss, test_accuracy = evaluate(model, data, device)
    return {"losses": losses, "test_loss": test_loss, "test_accuracy": test_accuracy,
            "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()}}


def evaluate_parameters(cfg: LabConfig, data: Digits, params: dict) -> tuple[float, float] | None:
    """(held-out loss, accuracy) of the whole model with the given parameters (those a pipeline's ranks
    ended training with), or None when some parameter is missing."""
    model = build_model(cfg)
    own = dict(model.named_parameters())
    if set(params) != set(own) or any(params[n].shape != own[n].shape for n in own):
        return None
    with torch.no_grad():
        for name, p in own.items():
            p.copy_(params[name])
    return evaluate(model, data)


@torch.no_grad()
def evaluate(model, data: Digits, device="cpu") -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of the whole model on the held-out images, in eval mode."""
    was_training = model.training
    model.eval()
    tokens, labels = (t.to(device) for t in data.test_set())
    scores = class_scores(model(tokens))
    model.train(was_training)
    return float(F.cross_entropy(scores, labels)), float((scores.argmax(-1) == labels).float().mean())
