"""The kinds of check case: what the ranks of a case do, each with one function `run(case, ctx, group,
tracer, obs)` that fills `obs` with what the rank observed (shared helpers: harness/observe.py). The core's
kinds are the modules of this package; each topic declares its own (lab_src/topics/<topic>/__init__.py). The
table below says, per kind, its module and the exercises its ranks call.

This file imports no kind: the launching process (the trusted grader among others) reads which exercises a
case calls without importing torch; a rank imports the kinds' modules before it loads any answer
(`runners`).
"""
from __future__ import annotations

import importlib
from dataclasses import replace

from lab_src import topics
from lab_src.registry import EXERCISES
from lab_src.topics import LAYOUT, Kind

CORE = {
    "pipeline": Kind("pipeline", record="StepObserved", settings="PerturbSettings",
                     calls=LAYOUT + ("needs_dataloader",), step=True,
                     what="the step function the case names (q08's afab_step, ...) with its comparisons' raw "
                          "material, and the probes of q07, q09 and q10"),
    "comm": Kind("comm", record="CommObserved", calls=LAYOUT + ("pipeline_communicate",),
                 what="the four point-to-point operations (q07) in the order of the case's schedule, carrying "
                      "labelled dummy tensors, no compute"),
    "layout": Kind("layout", record="LayoutObserved", calls=LAYOUT,
                   what="each rank's stage: micro-batch size (q02), activation shape (q03), layers (q05), and "
                        "with q06 among its calls whether it needs the dataloader, tried by feeding the stage"),
    "shapes": Kind("shapes", record="ShapesObserved", calls=("check_args", "activation_shape"),
                   what="the activation shape (q03) tried on the embedding, a block and the head"),
    "baseline": Kind("baseline", record="BaselineObserved", calls=("baseline_step",), what="the unsharded baseline (q04), run on every rank"),
    "units": Kind("units", record="UnitsObserved", calls=(), what="exercise functions called on given arguments"),
    "seeds": Kind("seeds", record="SeedsObserved", calls=(), what="what the seed does to weights on different ranks (q01 demo)"),
}
KINDS = {**{name: replace(k, module=f"{__name__}.{k.module}", record=f"lab_src.harness.observed:{k.record}",
                          settings=k.settings and f"lab_src.harness.settings:{k.settings}")
            for name, k in CORE.items()},
         **topics.kinds()}


def declared_class(kind: str, what: str, default: type) -> type:
    """The class a case kind's declaration names for `what` ("record", "settings": "module:Class"), or `default`."""
    name = getattr(KINDS[kind], what)
    if not name:
        return default
    module, _, cls = name.partition(":")
    return getattr(importlib.import_module(module), cls)


def runners() -> dict:
    """kind -> the function that runs a case of it on a rank (imports every kind's module)."""
    return {kind: importlib.import_module(k.module).run for kind, k in KINDS.items()}


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
