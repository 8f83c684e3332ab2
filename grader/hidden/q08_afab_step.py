"""Hidden tests of q08 (afab_step): full pipelines of 1 to 4 stages, 1 to 6 micro-batches, uneven
layers, float64 and other seeds, compared with the baseline and checked to be real pipelines."""
from .common import CONFIGS, pipeline_item

QID = "q08"


def cases(ctx):
    return [ctx.case(QID, "pipeline", c) for c in CONFIGS]


def judge(ctx, outcomes):
    return [pipeline_item(QID, ctx, o) for o in outcomes]
