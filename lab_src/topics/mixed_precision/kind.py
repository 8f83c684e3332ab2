"""Rank side of q26 (mixed_precision_layer, with LossScaler): the case's blocks (model.py), each wrapped by the
answer's `mixed_precision_layer(block, dp, compute_dtype)` over a data-parallel group of all the case's ranks
(`dp`: group.py's MixedGroup on the answer's q19 ring; in grading the reference's), then `steps` steps: this replica's
batch through the blocks, its float32 loss, the backward (in float16 through the answer's `LossScaler(dp,
growth_interval=...)`: `scaler.scale(loss).backward()`), the lab's inf on one rank's shard gradient where the case
puts one, then the lab's `torch.optim.SGD` on the shards (in float16 `scaler.step(optimizer)`, `scaler.update()`).

Recorded per rank (plain values, never a verdict): each block's flat length and shard length; per step the shards
before and after, their gradients as the backward left them (before the lab's inf and the scaler), the dtypes the
answer keeps them in, the scale after the update, every gather, reduce-scatter and all-reduce the answer asked for
(bytes and elements: what the ring carried), the replica's loss. Each step is two events of the timeline's main lane
(forward, backward), the gathers and reduce-scatters in lane 1 under them.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline.trace import Event
from lab_src.topics.mixed_precision import model as lab_model
from lab_src.topics.mixed_precision.group import MixedGroup
from lab_src.topics.mixed_precision.records import shard_bounds


def loss_scaler_class():
    """The answer cell's LossScaler (defined beside mixed_precision_layer)."""
    qid = exercises.mixed_precision_layer.exercise.id
    fn = answers.load(qid)
    if fn is None:
        raise answers.StubCalled(answers.stub_message(qid))
    cls = getattr(fn, "__globals__", {}).get("LossScaler")
    if not callable(cls):
        raise answers.AnswerError(f"{qid}: your answer cell must define the class LossScaler beside "
                                  f"mixed_precision_layer (see its contract)")
    return cls


def _scaler_call(fn, *args, **kwargs):
    """A call of the answer's LossScaler: a bare NotImplementedError (the release's stub) said as the stub it is."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as e:
        if str(e):
            raise
        qid = exercises.mixed_precision_layer.exercise.id
        name = "__init__" if isinstance(fn, type) else getattr(fn, "__name__", "a method")
        raise answers.StubCalled(f"{qid} LossScaler.{name}() is still the stub from "
                                 f"the release (raise NotImplementedError()): the float16 cases use it; write it in "
                                 f"{exercises.mixed_precision_layer.exercise.notebook}") from None


def _copy(t):
    return t.detach().float().cpu().clone() if isinstance(t, torch.Tensor) else None


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    obs["part"] = "setup"
    try:
        with coll.bounded(range(case.stages), "the data-parallel group", "dp.group"):
            mesh = Mesh.of(case, ctx, whole=group).build("dp")
            try:
                _steps(case, settings, mesh, tracer, obs)
                observe.finish_messages(None, group, tracer)
            finally:
                tracer.state_memory = None
                mesh.destroy()
    finally:
        observe.record_instrumentation(obs, tracer)


def _steps(case, settings, mesh, tracer, obs) -> None:
    cfg = case.config
    dtype = lab_model.DTYPES[settings.dtype]
    members = mesh.members("dp")
    dp = MixedGroup(mesh.group("dp"), members, mesh.rank)
    dp.ring = exercises.ring_all_reduce          # the answer's q19 ring (in grading, the reference's)
    dp.tracer = tracer
    n, me = dp.size, dp.rank
    obs["position"] = me
    layers, modules = {}, []
    for block in lab_model.blocks(cfg, settings):
        name = block.name
        total = sum(p.numel() for p in block.parameters())
        start, end = shard_bounds(total, n, me)
        obs["part"] = f"mixed_precision_layer({name})"
        module = exercises.mixed_precision_layer(block, dp, dtype)
        if not isinstance(module, nn.Module):
            raise TypeError(f"mixed_precision_layer must return an nn.Module standing for the block, got "
                            f"{type(module).__name__}")
        shard = getattr(module, "shard", None)
        if not isinstance(shard, nn.Parameter) or shard.dim() != 1 or shard.numel() != end - start:
            raise ValueError(f"the module mixed_precision_layer returns for {name} must hold its shard as "
                             f"`self.shard`, an nn.Parameter of the {end - start:,} elements {start:,} to {end:,} of the "
                             f"block's {total:,} flattened parameters (torch.tensor_split's shard {me} of {n}); it "
                             f"holds {getattr(shard, 'shape', type(shard).__name__)}")
        dp.register(name, shard, total)
        layers[name] = [total, end - start]
        modules.append(module)
    obs["layers_flat"] = layers
    shards = [m.shard for m in modules]
    optimizer = torch.optim.SGD(shards, lr=settings.lr)
    scaler = _scaler_call(loss_scaler_class(), dp, growth_interval=settings.growth_interval) if settings.scaled \
        else None
    # every event carries the training state the rank holds (the timeline's memory lane): its float32 shards (the
    # master), the gathered copies alive (in the compute dtype), the shards' gradients; SGD keeps no state
    tracer.state_memory = lambda: (sum(s.numel() * s.element_size() for s in shards), dp.gathered_bytes(),
                                   sum(s.grad.numel() * s.grad.element_size() for s in shards if s.grad is not None), 0)
    steps = obs["steps"] = []
    for k in range(settings.steps):
        observe.barrier(mesh.group("dp"))
        optimizer.zero_grad(set_to_none=True)
        dp.new_step()
        record = {"before": [_copy(s) for s in shards], "shard_dtype": str(shards[0].dtype).replace("torch.", "")}
        x, target = lab_model.batch(cfg, settings, k, me)
        obs["part"] = f"step {k}, forward"
        t0 = time.perf_counter()
        h = x
        for module in modules:
            h = module(h)
            if not isinstance(h, torch.Tensor) or h.dtype != torch.float32:
                raise TypeError(f"the module mixed_precision_layer returned gave {getattr(h, 'dtype', type(h))}: the "
                                f"contract returns the block's output in float32 (cast back after running in "
                                f"{settings.dtype})")
        loss = lab_model.loss_of(h, target)
        tracer.record(Event(tracer.rank, "forward", k, None, tuple(x.shape), 0, t0, time.perf_counter()))
        obs["part"] = f"step {k}, backward"
        t0 = time.perf_counter()
        (_scaler_call(scaler.scale, loss) if scaler is not None else loss).backward()
        tracer.record(Event(tracer.rank, "backward", k, None, tuple(x.shape), 0, t0, time.perf_counter()))
        record["grad"] = [_copy(s.grad) for s in shards]
        record["grad_dtype"] = str(shards[0].grad.dtype).replace("torch.", "") if shards[0].grad is not None else None
        if k == settings.inject_step and me == settings.inject_rank and shards[0].grad is not None:
            with torch.no_grad():
                shards[0].grad.view(-1)[0] = float("inf")     # the lab's inf: this rank's shard only
        obs["part"] = f"step {k}, optimizer step"
        if scaler is not None:
            _scaler_call(scaler.step, optimizer)
            _scaler_call(scaler.update)
            record["scale"] = float(_scaler_call(scaler.get_scale))
        else:
            optimizer.step()
            record["scale"] = None
        record.update(after=[_copy(s) for s in shards], loss=float(loss.detach()),
                      gathers=[[g[1], g[2], g[3]] for g in dp.gathers],
                      scatters=[[s[1], s[2]] for s in dp.scatters],
                      reduces=[list(r) for r in dp.reduces])
        steps.append(record)
    obs["part"] = "done"
