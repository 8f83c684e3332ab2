"""Extra calls of the student's own checks during a pipeline or communication case, asked for by the
case's `probes`: q07's no-ops at the ends of the pipeline, and q09's and q10's checks tried on the true
outputs and gradients and on wrong ones."""
from __future__ import annotations

import torch

from lab_src import exercises
from lab_src.harness.observe import attempt
from lab_src.pipeline import trace


def noop_ends(stage) -> dict:
    """The operations that do not apply at the ends of the pipeline must return None without messaging."""
    dummy = torch.zeros(stage.activation_shape, dtype=stage.dtype, device=stage.device)
    ops = []
    if stage.is_first_stage:
        ops += [("recv_forward", None), ("send_backward", dummy)]
    if stage.is_last_stage:
        ops += [("send_forward", dummy), ("recv_backward", None)]
    events = trace.active().events
    start, out = len(events), {}
    for op, tensor in ops:
        before = len(events)
        out[op] = attempt(exercises.pipeline_communicate, op, stage, tensor=tensor, microbatch=0)
        out[op]["messages"] = len(events) - before
    del events[start:]  # probes are not part of the schedule
    return out


def _disturb(t, where: str, sign: float):
    """A copy of `t` with one element moved by `sign` times more than its largest value: the first,
    middle or last element, so that a check reading only part of a tensor misses some of them."""
    out = t.detach().clone()
    flat = out.view(-1)
    k = {"first": 0, "middle": flat.numel() // 2, "last": flat.numel() - 1}[where]
    flat[k] += sign * (0.1 + float(out.abs().max()))
    return out


def _reversed_elements(t):
    """The same values in reverse order: equal sums, means and norms, different tensors."""
    return t.detach().reshape(-1).flip(0).reshape(t.shape).clone()


# Where a disturbance goes: every part of the data, with both signs, and changes that keep sums.
PLACES = (("first", 1.0), ("middle", -1.0), ("last", 1.0), ("first", -1.0), ("last", -1.0))
def check_outputs(stage, outputs, baseline) -> dict:
    """Run the q09 check on the true outputs, then on wrong ones: one element of the first, middle or
    last micro-batch moved up or down, two micro-batches swapped, one micro-batch's elements reversed."""
    base = baseline["output"].to(stage.device)
    result = {"true": attempt(exercises.check_outputs, outputs, base, stage)}
    if stage.is_last_stage and isinstance(outputs, list) and outputs:
        m = len(outputs)
        for (where, sign), mb in zip(PLACES, (0, m // 2, m - 1, m - 1, 0)):
            wrong = [o.detach().clone() for o in outputs]
            wrong[mb] = _disturb(wrong[mb], where, sign)
            result[f"micro-batch {mb}, {where} element {'+' if sign > 0 else '-'}"] = \
                attempt(exercises.check_outputs, wrong, base, stage)
        if m > 1:
            swapped = [o.detach().clone() for o in outputs]
            swapped[0], swapped[-1] = swapped[-1], swapped[0]
            result[f"micro-batches 0 and {m - 1} swapped"] = attempt(exercises.check_outputs, swapped, base, stage)
        flipped = [o.detach().clone() for o in outputs]
        flipped[m // 2] = _reversed_elements(flipped[m // 2])
        result[f"micro-batch {m // 2} with its elements reversed"] = attempt(exercises.check_outputs, flipped, base, stage)
    return result


def check_gradients(stage, baseline) -> dict:
    """Run the q10 check on the true gradients, then on a baseline changed in one element of the first,
    middle or last parameter (up or down), with one parameter's elements reversed, and with the first
    or the last parameter's gradient missing."""
    grads = {n: (g.to(stage.device) if g is not None else None) for n, g in baseline["grads"].items()}
    result = {"true": attempt(exercises.check_gradients, stage, grads)}
    owned = [n for n, _ in stage.named_parameters()]
    if owned:
        picks = (owned[0], owned[len(owned) // 2], owned[-1], owned[-1], owned[0])
        for (where, sign), name in zip(PLACES, picks):
            disturbed = dict(grads)
            disturbed[name] = _disturb(grads[name], where, sign)
            result[f"{name}, {where} element {'+' if sign > 0 else '-'}"] = \
                attempt(exercises.check_gradients, stage, disturbed)
        widest = max(owned, key=lambda n: grads[n].numel())
        disturbed = dict(grads)
        disturbed[widest] = _reversed_elements(grads[widest])
        result[f"{widest} with its elements reversed"] = attempt(exercises.check_gradients, stage, disturbed)
        for name in dict.fromkeys((owned[0], owned[-1])):
            param = stage.get_parameter(name)
            saved, param.grad = param.grad, None
            try:
                result[f"missing gradient of {name}"] = attempt(exercises.check_gradients, stage, grads)
            finally:
                param.grad = saved
        result["owned"] = owned
    return result
