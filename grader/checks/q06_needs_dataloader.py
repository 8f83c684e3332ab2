"""Hidden tests of q06 (needs_dataloader): every rank of pipelines of 1 to 8 stages, then full
pipelines where only the ranks the student names build a dataloader."""
from lab_src.problems import Problem

from .common import Item, call_reference, describe_result, pipeline_item, same_result, unit_results

QID = "q06"
CALLS = [(r, p) for p in range(1, 9) for r in range(p)]
PIPELINES = ["one micro-batch", "more micro-batches than stages", "uneven layers, seed 7"]


def cases(ctx):
    calls = [{"exercise": QID, "args": list(c)} for c in CALLS]
    return [ctx.case(QID, "units", calls=calls, label="ranks")] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    ref = ctx.reference_fn(QID)
    results = dict(zip(CALLS, unit_results(QID, units, CALLS)))
    items = []
    for p in range(1, 9):
        item = Item("ranks", f"{p} stages")
        for r in range(p):
            want, exc = call_reference(ref, (r, p), {})
            got = results[(r, p)]
            if not same_result(got, want, exc) or not isinstance(got.get("value"), bool):
                item.problems.append(Problem(QID, f"needs_dataloader({r}, {p}) {describe_result(got)}; "
                                                  f"expected {want}", r))
                break
        items.append(item)

    def dataloaders(outcome, label):
        problems = []
        for r, o in sorted(outcome.obs.items()):
            want = 1 if ref(r, outcome.case["stages"]) else 0
            if o.get("dataloaders", 0) != want:
                what = "built a dataloader it never reads" if want == 0 else "has no dataloader to read tokens from"
                problems.append(Problem(QID, f"this rank {what}", r, None, label))
        return problems

    return items + [pipeline_item(QID, ctx, o, extra=dataloaders) for o in pipes]
