"""The kinds of check case: what the ranks of a case do, one module each in this package, each with one
function `run(case, ctx, group, tracer, obs)` that fills `obs` with what the rank observed (shared
helpers: harness/observe.py). The table below says, per kind, its module and the exercises its ranks call.

This file imports no kind: the launching process (the trusted grader among others) reads which exercises a
case calls without importing torch; a rank imports the kinds' modules before it loads any answer
(`runners`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from lab_src.registry import EXERCISES

LAYOUT = ("check_args", "activation_shape", "distribute_layers")    # what building a stage calls


@dataclass(frozen=True)
class Kind:
    module: str                 # harness/kinds/<module>.py, whose `run` runs a case of this kind
    calls: tuple[str, ...]      # the exercise functions its ranks call: a case must carry their answers
    what: str                   # what its ranks do, in a line or two
    step: bool = False          # its ranks also call the case's step, and what that step uses


KINDS = {
    "pipeline": Kind("pipeline", LAYOUT + ("needs_dataloader",), step=True,
                     what="the step function the case names (q08's afab_step, ...) with its comparisons' raw "
                          "material, and the probes of q07, q09 and q10"),
    "comm": Kind("comm", LAYOUT + ("pipeline_communicate",),
                 what="the four point-to-point operations (q07) in the order of the case's schedule, carrying "
                      "labelled dummy tensors, no compute"),
    "layout": Kind("layout", LAYOUT,
                   what="each rank's stage: micro-batch size (q02), activation shape (q03), layers (q05), and "
                        "with q06 among its calls whether it needs the dataloader, tried by feeding the stage"),
    "shapes": Kind("shapes", ("check_args", "activation_shape"),
                   what="the activation shape (q03) tried on the embedding, a block and the head"),
    "baseline": Kind("baseline", ("baseline_step",), what="the unsharded baseline (q04), run on every rank"),
    "units": Kind("units", (), what="exercise functions called on given arguments"),
    "seeds": Kind("seeds", (), what="what the seed does to weights on different ranks (q01 demo)"),
    "grid": Kind("dp_pp", LAYOUT + ("needs_dataloader", "pipeline_communicate", "afab_step"),
                 what="the student's step on a data x pipeline grid of all the case's ranks (q14)"),
    "p2p": Kind("p2p", LAYOUT + ("p2p_communicate",),
                what="q11's raw torch.distributed operations in the order of the case's schedule"),
    "interleaved": Kind("interleaved", LAYOUT + ("needs_dataloader",), step=True,
                        what="an interleaved step (q15) on ranks holding several model chunks each"),
    "split": Kind("split", LAYOUT, step=True,
                  what="q16's split backward on every stage of the configuration, on one rank: the two halves "
                       "against one backward (gradients, floating-point operations, memory left)"),
    "train": Kind("train", LAYOUT, step=True,
                  what="the student's training loop around the step, on the digits (q13)"),
    "tp": Kind("tp", ("tp_layers",),
               what="q17's tensor-parallel pieces on the case's t ranks: the two communication functions, the "
                    "column- and row-parallel layers, the MLP; outputs, gradients, shards and collectives"),
    "tp_block": Kind("tp_block", ("tp_layers", "tp_block"),
                     what="q18's tensor-parallel block on the case's t ranks, dropout off and on: outputs, "
                          "gradients, shards, collectives, the replicated LayerNorms after an optimizer step"),
    "tp_train": Kind("tp_train", ("tp_layers", "tp_block"),
                     what="the digits model with q18's tensor-parallel blocks, trained on t ranks (or t x p: "
                          "tensor parallel inside pipeline stages); each rank's loss curve"),
    "torch": Kind("torch_schedule", LAYOUT,
                  what="torch.distributed.pipelining's Schedule1F1B on the case's stages (the notebooks' bridge, "
                       "ungraded)"),
}


def runners() -> dict:
    """kind -> the function that runs a case of it on a rank (imports every kind's module)."""
    return {kind: importlib.import_module(f"{__name__}.{k.module}").run for kind, k in KINDS.items()}


def exercises_called(kind: str, step: str = "", calls=()) -> set[str]:
    """The exercises a case of `kind` calls on its ranks: those of its `calls`, for a kind that runs a
    step the exercise `step` and what the step itself uses (the point-to-point operations), for a layout
    with "q06" the dataloader question. The baseline the comparisons need is computed outside, so q04 is
    not among them."""
    by_function = {e.function: e.id for e in EXERCISES.values() if e.function}
    called = {by_function[f] for f in KINDS[kind].calls}
    if KINDS[kind].step and step:
        called |= {step, *EXERCISES[step].needs} - {by_function["baseline_step"]}
    if kind == "layout" and "q06" in calls:
        called.add(by_function["needs_dataloader"])
    return called
