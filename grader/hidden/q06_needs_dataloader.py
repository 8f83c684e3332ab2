"""Hidden tests of q06 (needs_dataloader): every rank of pipelines of 1 to 8 stages, then full
pipelines where only the ranks the student names build a dataloader."""
from lab_src.judge.problems import Problem

from .common import pipeline_item, unit_items, units_case

QID = "q06"
CALLS = [((r, p), {}) for p in range(1, 9) for r in range(p)]
PIPELINES = ["one micro-batch", "more micro-batches than stages", "uneven layers, seed 7"]


def stages(args, kwargs) -> str:
    return f"{args[1]} stages"


def cases(ctx):
    return [units_case(ctx, QID, "ranks", CALLS)] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    ref = ctx.reference_fn(QID)

    def dataloaders(outcome):
        problems = []
        for r, o in sorted(outcome.obs.items()):
            want = 1 if ref(r, outcome.case.stages) else 0
            if o.get("dataloaders", 0) != want:
                what = "built a dataloader it never reads" if want == 0 else "has no dataloader to read tokens from"
                problems.append(Problem(f"this rank {what}", rank=r))
        return problems

    return unit_items(ctx, QID, units, CALLS, group=stages) + \
        [pipeline_item(QID, ctx, o, extra=dataloaders) for o in pipes]
