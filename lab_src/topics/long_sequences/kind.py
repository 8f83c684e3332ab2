"""Kind "recompute" (q23): the answer's `recompute_block(block, mode)` on one rank, each mode of the case in turn.

For each mode the rank builds the lab's block from the case's configuration (pipeline/model.py, dropout on, training
mode, in the case's dtype), asks the answer for its module, and measures it with the lab's own tools (measure.py),
never with anything the answer reports:

    kept   one forward: every storage it left alive and the input (what autograd saved, what a checkpoint or a ctx
           holds), less the parameters and the output
    flops  one forward and one backward of a fresh block: matmul FLOPs (torch.utils.flop_counter), and seconds
    run    a fresh block: forward A, forward B, backward B, backward A, then forward and backward C (micro-batches
           in flight at once, as in a pipeline): the outputs, the inputs' gradients and the parameters' gradients

The lab's own block is measured and run alike (`plain`): the figure's plain bar, and in bfloat16 the parameters'
gradients the answer's are held to (a LayerNorm's bias gradient, a bfloat16 sum over every token, moves by a quarter
with the number of threads that summed it: the judge's process cannot tell it). The judge (judge.py) rebuilds the
plain block in its own process and compares everything else with that. A part that raises is recorded and the next one runs.
"""
from __future__ import annotations

import traceback

import torch

from lab_src import answers, exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import waiting
from lab_src.topics.long_sequences import measure
from lab_src.topics.long_sequences.measure import inputs, make_block, sequence


def answer_line(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "q23_" in (f.filename or "")]
    return f"line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def returned_problem(module) -> str:
    if not isinstance(module, torch.nn.Module) and not callable(module):
        return f"{type(module).__name__}, not an nn.Module"
    return ""


def run_mode(cfg, settings, mode: str, rec: dict) -> None:
    xs = inputs(cfg, settings)
    for part in ("kept", "flops", "run"):
        block = make_block(cfg, settings.dtype)
        rec["part"] = part
        module = exercises.recompute_block(block, mode)
        rec["returned"] = returned_problem(module)
        if rec["returned"]:
            return
        if part == "kept":
            rec["kept"] = measure.kept(module, xs[0].clone().requires_grad_(), known=list(block.parameters()))
        elif part == "flops":
            rec["flops"] = measure.flops(module, xs[0].clone().requires_grad_())
        else:
            rec["run"] = sequence(module, block, xs)
    rec.pop("part", None)


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, settings = case.config, settings_of(case)
    try:
        run_modes(cfg, settings, obs)
    finally:
        observe.record_instrumentation(obs, tracer)


def run_modes(cfg, settings, obs) -> None:
    xs = inputs(cfg, settings)
    block = make_block(cfg, settings.dtype)
    plain = make_block(cfg, settings.dtype)
    obs["plain"] = {"kept": measure.kept(block, xs[0].clone().requires_grad_(), known=list(block.parameters())),
                    "flops": measure.flops(make_block(cfg, settings.dtype), xs[0].clone().requires_grad_()),
                    "run": sequence(plain, plain, xs)}
    obs["modes"] = {}
    for mode in settings.modes:
        rec = obs["modes"][mode] = {}
        try:
            run_mode(cfg, settings, mode, rec)
        except (answers.StubCalled, waiting.StoppedWaiting):
            raise
        except Exception as e:  # noqa: BLE001 - a mode that raises is an observation; the next mode runs
            message = str(e) or ("still the stub from the release (raise NotImplementedError())"
                                 if isinstance(e, NotImplementedError) else "")
            rec["raised"] = {"type": type(e).__name__, "message": message[:800], "line": answer_line(e),
                             "part": rec.pop("part", "")}
