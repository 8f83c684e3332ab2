"""Kind "split": q16's backward split in two, tried on one rank without messages. For every stage of the
case's configuration (the first, whose input is tokens; the middle ones; the last, whose output is its
loss), the rank builds the stage twice from the same seed, runs one micro-batch forward on each, and takes
the gradients of one plain backward on the first copy and of the student's two halves on the second
(`stage.backward_input`, then `stage.backward_weight`, which call the answer cell's `backward_input` and
`backward_weight`). Both copies start with the same gradient already in every `.grad`, as after an earlier
micro-batch, so that a W that overwrites instead of accumulating shows. It observes the largest
differences, the floating-point operations each way counted by `torch.utils.flop_counter` (a second pass
that redoes the input's path costs about 1.5 times a backward), and the bytes autograd still holds for
the micro-batch after I and after W (harness/memory.py)."""
from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from lab_src import answers
from lab_src.harness.case import Case
from lab_src.harness.memory import counting
from lab_src.harness.observe import micro_batch_size
from lab_src.pipeline import waiting
from lab_src.pipeline.stage import PipelineStage

EARLIER = 0.25      # the gradient every .grad holds before the micro-batch, as after an earlier one


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    mbs = obs["micro_batch_size"] = micro_batch_size(cfg)
    obs["split_stages"] = {r: _one_stage(cfg, r, mbs, ctx.device) for r in range(cfg.num_stages)}


def _one_stage(cfg, r: int, mbs: int, device) -> dict:
    p = cfg.num_stages
    plain = _gradients(cfg, r, p, mbs, device, split=False)
    try:
        split = _gradients(cfg, r, p, mbs, device, split=True)
    except (answers.StubCalled, waiting.StoppedWaiting):
        raise
    except Exception as e:  # noqa: BLE001 - every failure of student code is an observation
        return {"outcome": "raised", "type": type(e).__name__, "message": str(e)[:800]}
    out = {"outcome": "returned", "flops_backward": plain["flops"], "flops_split": split["flops"],
           "held_before": split["held_before"], "held_after_input": split["held_mid"],
           "held_after_weight": split["held_after"], "input_grad_diff": None, "weight_grad_diff": 0.0,
           "worst_weight": "", "missing_weights": [], "input_grad_returned": split["input_grad"] is not None}
    if plain["input_grad"] is not None:
        got = split["input_grad"]
        out["input_grad_diff"] = float((got - plain["input_grad"]).abs().max()) \
            if isinstance(got, torch.Tensor) and got.shape == plain["input_grad"].shape else float("inf")
    for name, want in plain["grads"].items():
        got = split["grads"].get(name)
        if got is None:
            out["missing_weights"].append(name)
            continue
        diff = float((got - want).abs().max())
        if diff > out["weight_grad_diff"]:
            out["weight_grad_diff"], out["worst_weight"] = diff, name
    out["overwritten"] = bool(out["weight_grad_diff"] > 0 and all(
        torch.allclose(split["grads"][n] + EARLIER, plain["grads"][n], rtol=1e-9, atol=1e-12)
        for n in plain["grads"] if n in split["grads"]))
    return out


def _gradients(cfg, r, p, mbs, device, split: bool) -> dict:
    stage = PipelineStage(cfg, r, p, mbs, device, None)
    dims = stage.activation_shape      # (batch, sequence, hidden) of what the stage receives
    gen = torch.Generator().manual_seed(cfg.seed + 1000 + r)
    with counting(stage) as saved:
        if stage.is_first_stage:
            x = torch.randint(0, cfg.vocab_size, dims[:2], generator=gen).to(device)
        else:
            x = torch.randn(dims, dtype=stage.dtype, generator=gen).to(device).requires_grad_()
        y = stage.forward(x)
        grad = None
        if stage.is_last_stage:
            y = y.mean()
        else:
            grad = torch.randn(dims, dtype=stage.dtype, generator=gen).to(device)
        for param in stage.parameters():
            param.grad = torch.full_like(param, EARLIER)
        held_before, held_mid = saved.now, None
        with FlopCounterMode(display=False) as flops:
            if split:
                input_grad = stage.backward_input(x, y, grad)
                held_mid = saved.now
                del x, y
                stage.backward_weight()
            else:
                input_grad = stage.backward(x, y, grad)
                del x, y
        held_after = saved.now
    input_grad = input_grad.detach() if isinstance(input_grad, torch.Tensor) else input_grad
    grads = {n: q.grad.detach().clone() for n, q in stage.named_parameters() if q.grad is not None}
    return {"input_grad": input_grad, "grads": grads, "flops": int(flops.get_total_flops()),
            "held_before": held_before, "held_mid": held_mid, "held_after": held_after}
