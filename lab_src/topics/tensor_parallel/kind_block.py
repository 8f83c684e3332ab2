"""Kind "tp_block" (q18): the answer's tensor-parallel block on the case's t ranks, one part after another.

The case's `settings["parts"]` name the parts (all of records.BLOCK_PARTS by default), and its `settings["replicas"]`
how many tensor-parallel groups of stages / replicas ranks run the block side by side (1 by default; q18's grid
case, where global ranks are not the tensor-parallel ones: records.grid_members):

    block      the block of the case's configuration, dropout off: one forward from the same x on every
               rank, a backward from the same output gradient, then one AdamW step of the module's parameters
    dropout    the same with dropout on (`records.BLOCK_DROPOUT`), its attention masks drawn per
               shard of t (pipeline/dropout.py), in training mode; between its forward and backward, one more
               forward from the same x in evaluation mode (`evaluated`), where nothing may be dropped

For each part the rank records (plain values and tensors, never a verdict): the output, the input's
gradient, the shapes, values and gradients of what its module holds (qkv, proj, mlp.up, mlp.down, the two
LayerNorms), its parameter elements, the collectives its forward and backward made, and the LayerNorms'
weights and biases after the optimizer's step. A part that raises is recorded as such and the next runs.

The answer gets q17's pieces (`q17`): in a notebook the student's q17 answer, in grading the reference's.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import waiting
from lab_src.pipeline.model import build_piece
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.kind_layers import PIECES, Part, _backward, answer_frames, caught, detached, piece
from lab_src.topics.tensor_parallel.records import BLOCK_PARTS, BLOCK_WHAT, part_config

LR = 1e-2
# the sub-modules of the answer's block the lab reads, by the name the records use
HELD = {"qkv": "qkv", "proj": "proj", "up": "mlp.up", "down": "mlp.down", "attn_norm": "attn_norm",
        "mlp_norm": "mlp_norm"}
NORMS = ("attn_norm", "mlp_norm")


def q17_pieces() -> SimpleNamespace:
    """The q17 answer's pieces, as the answer's `q17` argument."""
    return SimpleNamespace(**{name: piece(name) for name in PIECES}, tp_layers=exercises.tp_layers)


def sub(module, path: str):
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return None
    return module


def evaluated(module, x):
    """The module's output in evaluation mode (module.eval(), as a validation pass runs it; no autograd), its
    training mode restored after: with dropout on, nothing may be dropped."""
    module.eval()
    try:
        with torch.no_grad():
            return detached(module(x))
    finally:
        module.train()


def run_part(part: str, cfg, tp, tracer, rec: dict) -> None:
    dev = tp.device
    block = build_piece(part_config(part, cfg, tp.size), tpmod.BLOCK, dev)
    module = exercises.tp_block(block, tp, q17_pieces())
    if not isinstance(module, torch.nn.Module):
        rec["returned"] = f"{type(module).__name__}, not an nn.Module"
        return
    module.train()
    rec["params"] = sum(p.numel() for p in module.parameters())
    for key, path in HELD.items():
        m = sub(module, path)
        w = getattr(m, "weight", None)
        rec[f"{key}_weight_shape"] = list(w.shape) if isinstance(w, torch.Tensor) else None
    data = tpmod.block_inputs(cfg)
    x = data["x"].to(dev).clone().requires_grad_()
    p = Part(tracer, rec)
    out = module(x)
    p.forward_done()
    rec["out"] = detached(out)
    if part == "dropout":
        rec["eval_out"] = evaluated(module, data["x"].to(dev))
        p.start = len(tracer.events)    # its collectives are neither the forward's nor the backward's
    if _backward(out, data["grad"].to(dev), rec):
        p.backward_done()
    rec["in_grad"] = detached(x.grad)
    for key, path in HELD.items():
        m = sub(module, path)
        for name in ("weight", "bias"):
            rec[f"{key}_{name}_grad"] = detached(getattr(getattr(m, name, None), "grad", None))
    params = [q for q in module.parameters() if q.grad is not None]
    if params:
        torch.optim.AdamW(params, lr=LR).step()
    for key in NORMS:
        m = sub(module, key)
        for name in ("weight", "bias"):
            rec[f"{key}_{name}_after"] = detached(getattr(m, name, None))


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, settings = case.config, settings_of(case)
    # `replicas` > 1: that many tensor-parallel groups side by side, each running the whole block (the layout of
    # records.grid_members, as in a t x p grid): only there does a global rank differ from the tensor-parallel one
    replicas = settings.replicas
    t = case.stages // replicas
    finished = False
    # every rank of the case makes every group, in the same order (comm/mesh.py), as the trainings' grid does; with
    # one replica the tensor-parallel group is the case's own
    mesh = Mesh.of(case, ctx, whole=group).build("tp")
    tp = tpmod.TensorParallel(mesh.coord("tp"), t, mesh.group("tp"), ctx.device)
    obs["tp_block"] = {}
    with coll.bounded(mesh.members("tp"), "the tensor-parallel group", "tp.group"):
        try:
            for part in settings.parts or BLOCK_PARTS:
                observe.barrier(group)
                start = len(tracer.events)
                rec = obs["tp_block"][part] = {}
                try:
                    run_part(part, cfg, tp, tracer, rec)
                except (answers.StubCalled, waiting.StoppedWaiting, waiting.WaitTimedOut, coll.CollectiveGaveUp):
                    raise
                except Exception as e:  # noqa: BLE001 - a part that raises is an observation; the next part runs
                    message = str(e) or (f"still the stub from the release (raise NotImplementedError()): write it "
                                         f"in {exercises.tp_block.exercise.notebook}"
                                         if isinstance(e, NotImplementedError) else "")
                    frames = answer_frames(e, "q18")
                    rec.update(raised=type(e).__name__, message=message[:800],
                               line=f"line {frames[-1].lineno}: {frames[-1].line}" if frames else "",
                               rounds=[[ev.kind, ev.bytes, list(ev.group or ())]
                                       for ev in tracer.events[start:] if ev.is_collective])
                    obs.setdefault("caught", []).append(caught(e, message, frames, BLOCK_WHAT[part]))
            observe.finish_messages(None, group, tracer)
            finished = True
        finally:
            observe.record_instrumentation(obs, tracer)
            if finished:
                mesh.destroy()      # its threads; nothing is in flight on it any more
