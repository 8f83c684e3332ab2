"""Kind "train" (q13): every rank runs the student's training loop around the
pipelined step, on the digits, and records what it observed.

The rank builds its `ClassifierStage` (layers from q05), hands `train_pipeline` the stage, the data,
the step function and the numbers of the case, and keeps:
- what `train_pipeline` returned (the loss of every step and the held-out metrics, on the last stage);
- its parameters after training;
- each forward of its stage (training or eval mode, autograd on or off, labels or not);
- which events and forwards belong to which step: `step_fn` is the registry's step (the case's `step`:
  q08's AFAB; another schedule's step plugs in the same way), wrapped to note where each call starts and
  ends and to wait for the stage's sends at its end;
- what it read of the data (`digits.READS`), the pieces it built and ran, and its events;
- what every `optimizer.step()` of the run saw (`OptimizerWatch`, a hook PyTorch calls before any
  optimizer's step): which optimizers, their settings, whether they hold this stage's parameters and
  others, and whether those parameters had gradients at that moment.
Judging happens in the launching process (lab_src/topics/training/judge.py).
"""
from __future__ import annotations

import weakref

import torch

from lab_src import exercises
from lab_src.harness import observe
from lab_src.topics.training.records import settings
from lab_src.harness.case import Case
from lab_src.topics.training import digits
from lab_src.topics.training.classifier import ClassifierStage

# The numbers of a training case, unless the case's `settings` say otherwise.
def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, rank = case.config, ctx.rank
    s = settings(case)
    digits.READS.clear()
    try:
        mbs = obs["micro_batch_size"] = observe.micro_batch_size(cfg)
        stage = ClassifierStage(cfg, rank, cfg.num_stages, mbs, ctx.device, group)
        observe.observe_stage(stage, obs)
        data = digits.Digits(cfg, s["test_microbatches"])
        step = exercises.API[case.step]
        spans = obs["step_spans"] = []     # [events before, forwards before, events after, forwards after, m]

        def step_fn(stage_, data_iter, num_microbatches):
            start = [len(tracer.events), len(stage.forwards)]
            try:
                return step(stage_, data_iter, num_microbatches)
            finally:
                stage.flush()
                spans.append(start + [len(tracer.events), len(stage.forwards), observe.plain(num_microbatches)])

        observe.barrier(group)
        with OptimizerWatch(stage) as watch:
            returned = exercises.train_pipeline(stage, data, step_fn, s["steps"], s["lr"])
        obs["optimizer"] = watch.record
        observe.finish_messages(stage, group, tracer)
        obs["returned"] = _record(returned)
        obs["params"] = {n: p.detach().cpu().clone() for n, p in stage.named_parameters()}
    finally:
        if "stage" in locals():
            obs["forwards"] = list(stage.forwards)
        obs["reads"] = dict(digits.READS)
        observe.record_instrumentation(obs, tracer)


class OptimizerWatch:
    """Within the block, notes what each `optimizer.step()` sees (torch.optim's global step pre-hook):
    `record` = {"steps", "created" (distinct optimizers), "types", "settings" (distinct lr, betas, eps,
    weight_decay, amsgrad), "own" (this stage's parameters), "own_held" (the fewest of them an optimizer
    held at a step), "foreign_held" (the most other tensors it held), "steps_without_grads" (steps at
    which none of this stage's parameters had a non-zero gradient)}."""

    def __init__(self, stage):
        self.own = {id(p) for p in stage.parameters()}
        self.seen = weakref.WeakSet()
        self.record = {"steps": 0, "created": 0, "types": [], "settings": [], "own": len(self.own),
                       "own_held": None, "foreign_held": 0, "steps_without_grads": 0}
        self.handle = None

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        self.handle = register_optimizer_step_pre_hook(self._before_step)
        return self

    def __exit__(self, *exc):
        self.handle.remove()
        return False

    def _before_step(self, optimizer, args, kwargs):
        rec = self.record
        rec["steps"] += 1
        if optimizer not in self.seen:
            self.seen.add(optimizer)
            rec["created"] += 1
        name = type(optimizer).__name__
        if name not in rec["types"]:
            rec["types"].append(name)
        params = [p for g in optimizer.param_groups for p in g["params"]]
        own = [p for p in params if id(p) in self.own]
        rec["own_held"] = len(own) if rec["own_held"] is None else min(rec["own_held"], len(own))
        rec["foreign_held"] = max(rec["foreign_held"], len(params) - len(own))
        if not any(p.grad is not None and bool(p.grad.any()) for p in own):
            rec["steps_without_grads"] += 1
        for g in optimizer.param_groups:
            setting = [float(g.get("lr", 0.0)), [float(b) for b in g.get("betas", ())], float(g.get("eps", 0.0)),
                       float(g.get("weight_decay", 0.0)), bool(g.get("amsgrad", False))]
            if setting not in rec["settings"]:
                rec["settings"].append(setting)
        return None


def _record(returned):
    """What train_pipeline returned, as plain values: the metrics dict (losses as floats), else a description."""
    if returned is None:
        return None
    if not isinstance(returned, dict):
        return {"object": type(returned).__name__, "value": observe.plain(returned)}
    out = {}
    for key, value in list(returned.items())[:20]:
        if key == "losses" and isinstance(value, (list, tuple)):
            out[key] = [_number(v) for v in value][:100_000]
        else:
            out[str(key)] = _number(value)
    return out


def _number(v):
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return float(v.detach())
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    if hasattr(v, "__float__") and not isinstance(v, (torch.Tensor, bool, str)):
        try:
            return float(v)
        except (TypeError, ValueError):
            pass
    return observe.plain(v)
