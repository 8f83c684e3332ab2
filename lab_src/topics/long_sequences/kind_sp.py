"""Kind "sp_block" (q23's third answer): the answer cell's `sp_block(block, tp)` on the case's t ranks, one part after
another (records.py `SPSettings`: "block" dropout off, "dropout" on), each on a fresh lab block.

Every rank builds the unsharded block of the case's configuration (pipeline/model.py, its attention masks drawn per
shard of t), asks the answer for its module, draws the whole input x and output gradient from the seed (as q18's block
cases do: shards.py `block_inputs`) and hands the module its sequence shard, the positions
[r s/t, (r + 1) s/t) of every sequence; then the backward from its shard of the gradient. It records, never judging:

    out, in_grad    its shard of the output and of the input's gradient
    grads, shapes   the gradients and shapes of the weight and bias of what its module holds (records.SP_HELD)
    saved           what the forward saved for the backward: autograd's saved tensors (saved-tensor hooks of the
                    lab's, around the call), each storage once, the module's parameters left out; the largest
                    storages with the shapes and bytes of the tensors saved of them (a view saved of a larger
                    storage keeps all of it); "alive": every storage the forward left alive (harness/live.py: on
                    ctx outside save_for_backward, in a closure) and the input, less the parameters and the output
    forward,        the collectives each made (kind, bytes, group), from the core's recorder (comm/collectives.py)
    backward

A part that raises is recorded and the next one runs.
"""
from __future__ import annotations

import traceback

import torch

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.live import LiveTensors, addresses
from lab_src.harness.settings import settings_of
from lab_src.pipeline import waiting
from lab_src.pipeline.model import build_piece
from lab_src.topics.long_sequences.measure import DTYPES
from lab_src.topics.long_sequences.records import SP_DROPOUT, SP_FUNCTION, SP_HELD
from lab_src.topics.long_sequences import shards as tpmod
from lab_src.topics.long_sequences.shards import block_config


def sp_function():
    """The answer cell's `sp_block` (the student's, or in the grader the reference's)."""
    qid = exercises.recompute_block.exercise.id
    fn = answers.load(qid)
    if fn is None:
        raise answers.StubCalled(answers.stub_message(qid))
    found = getattr(fn, "__globals__", {}).get(SP_FUNCTION)
    if not callable(found):
        raise answers.AnswerError(f"{qid}: your answer cell must define {SP_FUNCTION}(block, tp) beside "
                                  f"recompute_block")
    return found


def answer_line(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "q23_" in (f.filename or "")]
    return f"line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def detached(v):
    return v.detach().clone() if isinstance(v, torch.Tensor) else None


def sub(module, name: str):
    return getattr(module, name, None)


class Saved:
    """Autograd's saved tensors while the block is open: each storage once, `known` storages (parameters) left out."""

    def __init__(self, known):
        self.known = {p.untyped_storage().data_ptr() for p in known}
        self.seen: dict[int, int] = {}
        self.shapes: dict[int, list] = {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        s = t.untyped_storage()
        if s.data_ptr() not in self.known:
            self.seen[s.data_ptr()] = s.nbytes()
            shapes = self.shapes.setdefault(s.data_ptr(), [])
            if len(shapes) < 4:
                shapes.append([list(t.shape), t.numel() * t.element_size()])
        return t

    def __enter__(self):
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    def record(self) -> dict:
        biggest = sorted(self.seen, key=self.seen.get, reverse=True)[:24]
        return {"bytes": sum(self.seen.values()), "storages": len(self.seen),
                "largest": max(self.seen.values(), default=0),
                "kept": [[self.seen[p], self.shapes.get(p, [])] for p in biggest]}


def collectives(tracer, start: int) -> list:
    return [[e.kind, e.bytes, list(e.group or ())] for e in tracer.events[start:] if e.is_collective]


def run_part(part: str, cfg, settings, tp, tracer, rec: dict) -> None:
    t, r = tp.size, tp.rank
    cfg = block_config(cfg, t, SP_DROPOUT if part == "dropout" else 0.0)
    if settings.batch:
        cfg = cfg.replace(global_batch_size=settings.batch * cfg.num_microbatches)
    dtype = DTYPES[settings.dtype] if settings.dtype else cfg.torch_dtype
    block = build_piece(cfg, tpmod.BLOCK, tp.device).to(dtype).train()
    data = tpmod.block_inputs(cfg)
    b, s, h = data["x"].shape
    rec["shape"] = [b, s, h, cfg.num_heads, torch.finfo(dtype).bits // 8, t]
    module = sp_function()(block, tp)
    if not isinstance(module, torch.nn.Module):
        rec["returned"] = f"{type(module).__name__}, not an nn.Module"
        return
    module.train()
    rec["shapes"] = {}
    for name in SP_HELD:
        w = getattr(sub(module, name), "weight", None)
        rec["shapes"][name] = list(w.shape) if isinstance(w, torch.Tensor) else None
    x = data["x"].to(device=tp.device, dtype=dtype).chunk(t, dim=1)[r].clone().requires_grad_()
    grad = data["grad"].to(device=tp.device, dtype=dtype).chunk(t, dim=1)[r].contiguous()
    start = len(tracer.events)
    params = list(module.parameters()) + list(block.parameters())
    live = LiveTensors()
    live.mark()
    with live.saving(), Saved(params) as saved:
        out = module(x)
    rec["saved"] = saved.record()
    # every storage the forward left alive, wherever the answer keeps it (on ctx outside save_for_backward, in a
    # closure), less the parameters and the output; the input counts, as autograd saves it (the LayerNorm's)
    found = live.grown(addresses(params) | addresses([x]) | addresses([out] if isinstance(out, torch.Tensor) else []))
    rec["saved"]["alive"] = found.bytes + x.untyped_storage().nbytes()
    rec["forward"] = collectives(tracer, start)
    rec["out"] = detached(out)
    start = len(tracer.events)
    if isinstance(out, torch.Tensor) and out.requires_grad and tuple(out.shape) == tuple(grad.shape):
        out.backward(grad)
    rec["backward"] = collectives(tracer, start)
    rec["in_grad"] = detached(x.grad)
    rec["grads"] = {f"{name}.{p}": detached(getattr(getattr(sub(module, name), p, None), "grad", None))
                    for name in SP_HELD for p in ("weight", "bias")}


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, settings = case.config, settings_of(case)
    finished = False
    mesh = Mesh.of(case, ctx, whole=group).build("tp")
    tp = tpmod.TensorParallel(mesh.coord("tp"), case.stages, mesh.group("tp"), ctx.device)
    obs["parts"] = {}
    with coll.bounded(mesh.members("tp"), "the tensor-parallel group", "tp.group"):
        try:
            for part in settings.parts:
                observe.barrier(group)
                rec = obs["parts"][part] = {}
                try:
                    run_part(part, cfg, settings, tp, tracer, rec)
                except (answers.StubCalled, waiting.StoppedWaiting, waiting.WaitTimedOut, coll.CollectiveGaveUp):
                    raise
                except Exception as e:  # noqa: BLE001 - a part that raises is an observation; the next part runs
                    message = str(e) or ("still the stub from the release (raise NotImplementedError())"
                                         if isinstance(e, NotImplementedError) else "")
                    rec["raised"] = {"type": type(e).__name__, "message": message[:800], "line": answer_line(e)}
            observe.finish_messages(None, group, tracer)
            finished = True
        finally:
            observe.record_instrumentation(obs, tracer)
            if finished:
                mesh.destroy()
