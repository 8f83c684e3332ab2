"""The "train" case kind (exercise q13): every rank runs the student's training loop around the
pipelined step, on the digits, and records what it observed.

The rank builds its `ClassifierStage` (layers from q05), hands `train_pipeline` the stage, the data,
the step function and the numbers of the case, and keeps:
- what `train_pipeline` returned (the loss of every step and the held-out metrics, on the last stage);
- its parameters after training;
- each forward of its stage (training or eval mode, autograd on or off, labels or not);
- which events and forwards belong to which step: `step_fn` is the registry's step (the case's `step`:
  q08's AFAB; another schedule's step plugs in the same way), wrapped to note where each call starts and
  ends and to wait for the stage's sends at its end;
- what it read of the data (`digits.READS`), the pieces it built and ran, and its events.
Judging happens in the launching process (lab_src/judge/training.py).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lab_src import exercises
from lab_src.harness.case import Case
from lab_src.pipeline import digits
from lab_src.pipeline.classifier import ClassifierStage

# The numbers of a training case, unless the case's `settings` say otherwise.
DEFAULTS = {"steps": 30, "lr": 3e-3, "test_microbatches": None}


def settings(case: Case) -> dict:
    return {**DEFAULTS, **(case.settings or {})}


def run_train(case: Case, ctx, group, tracer, obs) -> None:
    from lab_src.harness.cases import _micro_batch_size, _record_instrumentation, plain
    cfg, rank = case.config, ctx.rank
    s = settings(case)
    digits.READS.clear()
    try:
        mbs = obs["micro_batch_size"] = _micro_batch_size(cfg)
        stage = ClassifierStage(cfg, rank, cfg.num_stages, mbs, ctx.device, group)
        obs["layers"] = stage.layer_ids
        obs["activation_shape"] = list(stage.activation_shape)
        data = digits.Digits(cfg, s["test_microbatches"])
        step = exercises.API[case.step]
        spans = obs["step_spans"] = []     # [events before, forwards before, events after, forwards after, m]

        def step_fn(stage_, data_iter, num_microbatches):
            start = [len(tracer.events), len(stage.forwards)]
            try:
                return step(stage_, data_iter, num_microbatches)
            finally:
                stage.flush()
                spans.append(start + [len(tracer.events), len(stage.forwards), plain(num_microbatches)])

        dist.barrier(group=group)
        returned = exercises.train_pipeline(stage, data, step_fn, s["steps"], s["lr"])
        stage.flush()
        dist.barrier(group=group)
        obs["returned"] = _record(returned)
        obs["params"] = {n: p.detach().cpu().clone() for n, p in stage.named_parameters()}
    finally:
        if "stage" in locals():
            obs["forwards"] = list(stage.forwards)
        obs["reads"] = dict(digits.READS)
        _record_instrumentation(obs, tracer)


def _record(returned):
    """What train_pipeline returned, as plain values: the metrics dict (losses as floats), else a description."""
    from lab_src.harness.cases import plain
    if returned is None:
        return None
    if not isinstance(returned, dict):
        return {"object": type(returned).__name__, "value": plain(returned)}
    out = {}
    for key, value in list(returned.items())[:20]:
        if key == "losses" and isinstance(value, (list, tuple)):
            out[key] = [_number(v) for v in value][:100_000]
        else:
            out[str(key)] = _number(value)
    return out


def _number(v):
    from lab_src.harness.cases import plain
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hasattr(v, "__float__") and not isinstance(v, (torch.Tensor, bool, str)):
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    return plain(v)
