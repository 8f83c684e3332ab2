"""Hidden tests of q05 (distribute_layers): every stage of many (layers, stages) splits, even and
uneven, then full pipelines built from the student's layer assignment."""
from .common import pipeline_item, unit_items, units_case

QID = "q05"
CALLS = [((n, r, p), {}) for p in range(1, 7) for n in range(p, 13) for r in range(p)]
PIPELINES = ["one micro-batch", "uneven layers, seed 7", "more micro-batches than stages"]


def split(args, kwargs) -> str:
    n, _, p = args
    return f"{n} layers on {p} stages"


def cases(ctx):
    return [units_case(ctx, QID, "splits", CALLS)] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    return unit_items(ctx, QID, units, CALLS, group=split) + [pipeline_item(QID, ctx, o) for o in pipes]
