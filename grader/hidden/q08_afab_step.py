"""Hidden tests of q08 (afab_step): full pipelines of 1 to 4 stages, 1 to 6 micro-batches, uneven
layers, float64 and other seeds, compared with the baseline and checked to be real pipelines: in every
case of 2 stages or more the lab changes stage 0's weights once built, and the outputs must follow."""
from .common import pipeline_cases, pipeline_item

QID = "q08"


def cases(ctx):
    return pipeline_cases(ctx, QID)


def judge(ctx, outcomes):
    return [pipeline_item(QID, ctx, o) for o in outcomes]
