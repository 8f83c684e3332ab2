"""Hidden tests of q10 (check_gradients): after reference pipelines, the student's check must pass on the
true gradients, name exactly the parameters each stage owns, and raise on every kind of wrong gradients:
one element of the first, middle or last parameter's baseline moved up or down, one parameter's elements
reversed (same sum), the first or last parameter's gradient missing. A case passes only when all do."""
from lab_src.judge.probes import judge_check_gradients

from .common import pipeline_item

QID = "q10"
PIPELINES = ["more micro-batches than stages", "uneven layers, seed 7", "float64, seed 123"]


def cases(ctx):
    return [ctx.case(QID, "pipeline", c, probes=["check_gradients"]) for c in PIPELINES]


def judge(ctx, outcomes):
    return [pipeline_item(QID, ctx, o, part="checks", extra=judge_check_gradients)
            for o in outcomes]
