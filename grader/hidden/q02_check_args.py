"""Hidden tests of q02 (check_args): valid and invalid configurations called directly, then full
pipelines whose micro-batch size comes from the student's answer."""
from .common import pipeline_item, unit_items, units_case

QID = "q02"
CALLS = [
    ((8, 4, 8, 4), {}), ((8, 2, 12, 3), {}), ((6, 3, 6, 1), {}), ((1, 1, 1, 1), {}), ((3, 3, 5, 5), {}),
    ((7, 3, 8, 4), {"allow_uneven_layers": True}), ((4, 4, 8, 8), {"allow_uneven_layers": True}),
    ((8, 3, 8, 4), {}), ((7, 3, 8, 4), {}), ((8, 4, 10, 4), {}), ((12, 4, 8, 16), {}), ((8, 0, 8, 4), {}),
    ((8, 4, 8, 0), {}), ((8, -2, 8, 4), {}), ((2, 3, 6, 3), {"allow_uneven_layers": True}),
    ((7, 2, 9, 2), {"allow_uneven_layers": True}),
]
PIPELINES = ["one micro-batch", "uneven layers, seed 7", "more micro-batches than stages"]


def cases(ctx):
    return [units_case(ctx, QID, "calls", CALLS)] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    return unit_items(ctx, QID, units, CALLS) + [pipeline_item(QID, ctx, o) for o in pipes]
