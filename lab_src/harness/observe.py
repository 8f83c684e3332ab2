"""What every kind of case shares on a rank (harness/kinds/): calling student code and describing what
happened in plain values, building a stage and observing it, the barrier, the end of a rank's messages,
and the instrumentation every case records.

A rank fills `obs` (a dict of plain values and tensors, saved with `torch.save` and read back with
`weights_only=True`) with what it observed; it never decides pass or fail. The process that launched the
run reads the observations and judges them, so nothing a rank does can write a verdict.
"""
from __future__ import annotations

import operator

import torch

from lab_src import answers, exercises
from lab_src.harness import case_barrier
from lab_src.pipeline import data, model, trace, waiting
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.stage import PipelineStage


def attempt(fn, *args, **kwargs) -> dict:
    """Call `fn`, and describe what happened in plain values. Two failures are not observations of the
    answer and go on up: a stub (the case reports one problem: no answer yet) and a wait the check stopped
    (the rank must leave the case at once)."""
    try:
        return {"outcome": "returned", "value": plain(fn(*args, **kwargs))}
    except (answers.StubCalled, waiting.StoppedWaiting):
        raise
    except Exception as e:  # noqa: BLE001 - every failure of student code is an observation
        return {"outcome": "raised", "type": type(e).__name__, "message": str(e)[:800]}


def plain(v):
    """A value reduced to what `torch.load(weights_only=True)` reads back: no arbitrary objects.
    Int-like values (numpy integers, anything with __index__) become ints; numpy bools become bools."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if type(v).__name__ in ("bool_", "bool8"):
        return bool(v)
    if hasattr(v, "__index__") and not isinstance(v, torch.Tensor):
        return operator.index(v)
    if isinstance(v, torch.Size):
        return [int(s) for s in v]
    if isinstance(v, torch.Tensor):
        return {"tensor_shape": list(v.shape), "dtype": str(v.dtype)}
    if isinstance(v, (list, tuple, range)):
        return [plain(x) for x in v][:10_000]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in list(v.items())[:10_000]}
    return {"object": type(v).__name__}


def decode(v):
    """Arguments travel as JSON; {"$cfg": {...}} stands for a LabConfig."""
    if isinstance(v, dict) and "$cfg" in v:
        return LabConfig.from_dict(v["$cfg"])
    if isinstance(v, list):
        return [decode(x) for x in v]
    return v


def micro_batch_size(cfg: LabConfig) -> int:
    """q02's answer for `cfg`, which every stage is built with."""
    mbs = exercises.check_args(cfg.num_layers, cfg.num_stages, cfg.global_batch_size, cfg.num_microbatches,
                               allow_uneven_layers=not cfg.layers_divide_evenly)
    if isinstance(mbs, bool) or not isinstance(mbs, int) or mbs < 1:
        raise TypeError(f"q02: check_args must return the micro-batch size (an int >= 1), got {mbs!r}")
    return mbs


def build_stage(cfg: LabConfig, ctx, group, obs: dict) -> PipelineStage:
    """This rank's stage of `cfg`, with its micro-batch size, layers and activation shape observed."""
    mbs = obs["micro_batch_size"] = micro_batch_size(cfg)
    stage = PipelineStage(cfg, ctx.rank, cfg.num_stages, mbs, ctx.device, group)
    observe_stage(stage, obs)
    return stage


def observe_stage(stage, obs: dict) -> None:
    obs["layers"] = stage.layer_ids
    obs["activation_shape"] = list(stage.activation_shape)


def gradients(stage) -> dict:
    """name -> a copy of the stage's gradient of that parameter (None where it has none)."""
    return {n: (p.grad.detach().cpu().clone() if p.grad is not None else None) for n, p in stage.named_parameters()}


def unpack_step(returned, obs: dict):
    """(outputs, loss) of a step's return as plain tensors/floats; a malformed return is noted, not raised."""
    try:
        outputs, loss = returned
    except (TypeError, ValueError):
        obs["returned"] = f"the step must return (outputs, loss); it returned {plain(returned)!r}"[:500]
        return None, None
    outs = None
    if isinstance(outputs, (list, tuple)) and all(isinstance(o, torch.Tensor) for o in outputs):
        outs = [o.detach().cpu().clone() for o in outputs]
    else:
        obs["returned"] = f"outputs must be a list of tensors, got {plain(outputs)!r}"[:500]
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        loss = float(loss)
    if loss is not None and not isinstance(loss, (int, float)):
        obs["returned"] = f"loss must be a float or None, got {plain(loss)!r}"[:500]
        loss = None
    return outs, (float(loss) if loss is not None else None)


def label_tensor(stage, rank: int, mb: int, phase: str) -> torch.Tensor:
    """A tensor of the activation shape whose every element says (sender, micro-batch, direction)."""
    label = (1 if phase == "forward" else -1) * (1000 * (rank + 1) + mb)
    return torch.full(stage.activation_shape, float(label), dtype=stage.dtype, device=stage.device)


def read_label(value):
    """Decode a `label_tensor` back to (sender rank, micro-batch, direction); describe anything else."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return {"object": type(value).__name__}
    flat = value.detach().reshape(-1)
    if flat.numel() == 0 or not torch.all(flat == flat[0]):
        return {"tensor_shape": list(value.shape), "uniform": False}
    label = int(flat[0].item())
    sign = 1 if label > 0 else -1
    label = abs(label)
    return {"from": label // 1000 - 1, "mb": label % 1000, "phase": "forward" if sign > 0 else "backward",
            "shape": list(value.shape)}


def barrier(group) -> list[int]:
    """A barrier of the case's ranks that the check can stop (pipeline/waiting.py), through the store
    (harness/case_barrier.py: a rank that left the case early counts as there); the group's own barrier
    outside a case. Returns the ranks that had left the case instead of reaching the barrier (none outside a
    case): a kind whose next step is a collective of the lab's own, which the watch does not see, asks them.
    It is journalled as a wait at the barrier (trace.at_barrier), which ends when the rank is through: a peer
    stuck in a collective the rank skipped is then a deadlock the watch sees. Not as the rank having done its
    part (W): after a barrier a rank may compute for seconds (q13's single-process model) before its next
    message, and the watch would take its peers' waits for a deadlock."""
    if case_barrier.active():
        with trace.at_barrier(case_barrier.ranks()):
            return case_barrier.reach()
    waiting.barrier(group)
    return []


def finish_messages(stage, group, tracer) -> None:
    """The end of a rank's part of a case: it sends nothing more (journalled for the deadlock watch),
    waits until its messages are delivered (`stage`: None where there is none), then for the other ranks."""
    tracer.finished()
    if stage is not None:
        stage.flush()
    if case_barrier.active():
        case_barrier.end()
    else:
        waiting.barrier(group)


def record_instrumentation(obs: dict, tracer) -> None:
    """The pieces the rank built and ran, the dataloaders it made, and its events."""
    obs["built"] = list(model.BUILT)
    obs["ran"] = dict(model.RAN)
    obs["dataloaders"] = data.CREATED["dataloaders"]
    obs["events"] = [e.to_row() for e in tracer.events]
