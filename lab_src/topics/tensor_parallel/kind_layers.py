"""Kind "tp" (q17): the answer's tensor-parallel pieces on the case's t ranks, one part after another.

The case's `calls` name the parts (all of records.LAYER_PARTS by default):

    copy     CopyToTensorParallel.apply(x, tp) on the same x everywhere, then a backward from each rank's
             own gradient
    reduce   ReduceFromTensorParallel.apply(part, tp) on a different part per rank, then a backward
    column   ColumnParallelLinear(up, tp) on x, backward from this rank's slice of the full output's gradient
    row      RowParallelLinear(down, tp) on this rank's slice of gelu(up(x)), backward from the output's gradient
    mlp      tp_layers(up, down, tp) on x, backward from the output's gradient

For each part the rank records (plain values and tensors, never a verdict): the output, the input's
gradient, the shards the layer holds (shapes right after construction, values, gradients), the number of
parameter elements it holds, and the collectives its forward and its backward made (kind, bytes, global
ranks), read from the event record (comm/collectives.py records the answer's own torch.distributed calls),
with what each all-reduce was handed and gave back: the judge checks that the output (or the input's gradient)
is made of that sum, which an answer that computes the whole layer some other way cannot fake by reducing zeros.
A part that raises is recorded as such and the next part runs. The inputs are drawn from the
configuration's seed (topics/tensor_parallel/runtime.py), so the judge (topics/tensor_parallel/judge_layers.py) draws the same ones.
"""
from __future__ import annotations

import traceback
from pathlib import Path

import torch

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import waiting
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.records import LAYER_PARTS, LAYER_WHAT

# the names the q17 answer cell defines beside tp_layers
PIECES = ("CopyToTensorParallel", "ReduceFromTensorParallel", "ColumnParallelLinear", "RowParallelLinear")


def piece(name: str):
    """The class `name` of the q17 answer cell (the student's, or in the grader the reference)."""
    qid = exercises.tp_layers.exercise.id
    fn = answers.load(qid)
    if fn is None:
        raise answers.StubCalled(answers.stub_message(qid))
    found = getattr(fn, "__globals__", {}).get(name)
    if found is None:
        raise answers.AnswerError(f"{qid}: your answer cell must define {name} beside tp_layers "
                                  f"(see the contract of tp_layers)")
    return found


def rounds(tracer, start: int) -> list[list]:
    """The collectives recorded since event `start`: [kind, bytes, global ranks]."""
    return [[e.kind, e.bytes, list(e.group or ())] for e in tracer.events[start:] if e.is_collective]


def detached(v):
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else None


def held(module) -> dict:
    """What a layer holds: its weight's and bias's shapes and values, and all its parameters' elements."""
    out = {"params": sum(p.numel() for p in module.parameters()) if hasattr(module, "parameters") else None}
    for name in ("weight", "bias"):
        v = getattr(module, name, None)
        out[f"{name}_shape"] = list(v.shape) if isinstance(v, torch.Tensor) else None
        out[name] = detached(v)
    return out


def grads(module, prefix: str = "") -> dict:
    return {f"{prefix}{name}_grad": detached(getattr(getattr(module, name, None), "grad", None))
            for name in ("weight", "bias")}


class Part:
    """One part's record `rec`: the collectives of the phase in progress go to "fwd" or "bwd", and what each of
    its all-reduces was handed and gave back to "fwd_carried" or "bwd_carried" (coll.CARRIED)."""

    def __init__(self, tracer, rec: dict):
        self.tracer, self.rec, self.start = tracer, rec, len(tracer.events)
        self.carried = len(coll.CARRIED or ())
        rec.update(fwd=[], bwd=[], fwd_carried=[], bwd_carried=[])

    def _phase(self, phase: str) -> None:
        self.rec[phase] = rounds(self.tracer, self.start)
        self.rec[f"{phase}_span"] = [self.start, len(self.tracer.events)]    # which of the rank's events, for the timeline
        self.rec[f"{phase}_carried"] = list((coll.CARRIED or [])[self.carried:])
        self.start, self.carried = len(self.tracer.events), len(coll.CARRIED or ())

    def forward_done(self) -> None:
        self._phase("fwd")

    def backward_done(self) -> None:
        self._phase("bwd")


def _backward(out, grad, rec: dict) -> bool:
    """out.backward(grad) when the shapes agree; otherwise the mismatch is the observation."""
    if not isinstance(out, torch.Tensor):
        rec["returned"] = f"{type(out).__name__}, not a tensor"
        return False
    if tuple(out.shape) != tuple(grad.shape):
        rec["out_shape"] = list(out.shape)
        return False
    if out.grad_fn is None:
        rec["no_graph"] = True
        return False
    out.backward(grad)
    return True


def run_part(part: str, cfg, tp, data: dict, tracer, rec: dict) -> None:
    """Run one part, filling `rec` as it goes (what a layer holds is kept even when its forward raises)."""
    r, t, dev = tp.rank, tp.size, tp.device
    p = Part(tracer, rec)
    if part in ("copy", "reduce"):
        fn = piece("CopyToTensorParallel" if part == "copy" else "ReduceFromTensorParallel")
        x = (data["x"] if part == "copy" else data["parts"][r]).to(dev).clone().requires_grad_()
        out = fn.apply(x, tp)
        p.forward_done()
        rec["out"] = detached(out)
        grad = (data["copy_grads"][r] if part == "copy" else data["grad"]).to(dev)
        if _backward(out, grad, rec):
            p.backward_done()
        rec["in_grad"] = detached(x.grad)
        return
    up, down = tpmod.full_mlp(cfg, dev)
    if part == "column":
        layer = piece("ColumnParallelLinear")(up, tp)
        rec.update(held(layer))
        x = data["x"].to(dev).clone().requires_grad_()
        grad = tpmod.shard(data["col_grad"], r, t, -1).to(dev)
    elif part == "row":
        layer = piece("RowParallelLinear")(down, tp)
        rec.update(held(layer))
        x = tpmod.shard(tpmod.hidden_activation(cfg, data["x"]), r, t, -1).to(dev).clone().requires_grad_()
        grad = data["grad"].to(dev)
    else:
        layer = exercises.tp_layers(up, down, tp)
        rec["params"] = sum(q.numel() for q in layer.parameters()) if hasattr(layer, "parameters") else None
        for name in ("up", "down"):
            sub = getattr(layer, name, None)
            rec[f"{name}_weight_shape"] = held(sub)["weight_shape"] if sub is not None else None
        x = data["x"].to(dev).clone().requires_grad_()
        grad = data["grad"].to(dev)
    out = layer(x)
    p.forward_done()
    rec["out"] = detached(out)
    if _backward(out, grad, rec):
        p.backward_done()
    rec["in_grad"] = detached(x.grad)
    if part == "mlp":
        for name in ("up", "down"):
            rec.update(grads(getattr(layer, name, None), f"{name}_"))
    else:
        rec.update(grads(layer))


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    tp = tpmod.TensorParallel(ctx.rank, case.stages, group, ctx.device)
    data = tpmod.inputs(cfg, case.stages)
    obs["tp"] = {}
    with coll.bounded(range(case.stages), "the tensor-parallel group", "tp.group"):
        coll.CARRIED = []
        try:
            for part in case.calls or LAYER_PARTS:
                observe.barrier(group)
                start = len(tracer.events)
                rec = obs["tp"][part] = {}
                try:
                    run_part(part, cfg, tp, data, tracer, rec)
                except (answers.StubCalled, waiting.StoppedWaiting, waiting.WaitTimedOut, coll.CollectiveGaveUp):
                    raise
                except Exception as e:  # noqa: BLE001 - a part that raises is an observation; the next part runs
                    message = str(e) or (f"still the stub from the release (raise NotImplementedError()): write it "
                                         f"in {exercises.tp_layers.exercise.notebook}"
                                         if isinstance(e, NotImplementedError) else "")
                    rec.update(raised=type(e).__name__, message=message[:800], line=_answer_line(e),
                               rounds=rounds(tracer, start))
                    obs.setdefault("caught", []).append(caught(e, message, answer_frames(e), LAYER_WHAT[part]))
            observe.finish_messages(None, group, tracer)
        finally:
            coll.CARRIED = None
            observe.record_instrumentation(obs, tracer)


def answer_frames(e: BaseException, qid: str = "q17") -> list:
    """The frames of exercise `qid`'s answer file that the exception went through."""
    return [f for f in traceback.extract_tb(e.__traceback__) if f"{qid}_" in (f.filename or "")]


def _answer_line(e: BaseException) -> str:
    """The last line of the answer's own code the exception went through ("" when none)."""
    frames = answer_frames(e)
    return f"line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def caught(e: BaseException, message: str, frames: list, what: str) -> dict:
    """An exception of the answer that a part kept as its observation, for Observed.caught: what raised it, in
    words, and the answer's last line it went through."""
    where = f"{Path(frames[-1].filename).name} line {frames[-1].lineno}: {frames[-1].line}" if frames else ""
    return {"type": type(e).__name__, "message": message[:800], "line": where, "what": what}
