"""Hidden tests of q09 (check_outputs): after reference pipelines, the student's check must pass on the
true outputs (True on the last stage, False elsewhere) and raise on every kind of wrong outputs: one
element of the first, middle or last micro-batch moved up or down, two micro-batches swapped, one
micro-batch's elements reversed (the last two keep every sum). A case passes only when all of them do."""
from lab_src.judge.probes import judge_check_outputs

from .common import pipeline_item

QID = "q09"
PIPELINES = ["more micro-batches than stages", "uneven layers, seed 7", "float64, seed 123"]


def cases(ctx):
    return [ctx.case(QID, "pipeline", c, probes=["check_outputs"]) for c in PIPELINES]


def judge(ctx, outcomes):
    return [pipeline_item(QID, ctx, o, part="checks", extra=judge_check_outputs)
            for o in outcomes]
