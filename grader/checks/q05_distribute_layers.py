"""Hidden tests of q05 (distribute_layers): every stage of many (layers, stages) splits, even and
uneven, then full pipelines built from the student's layer assignment."""
from lab_src.problems import Problem

from .common import Item, call_reference, describe_result, pipeline_item, same_result, unit_results

QID = "q05"
SPLITS = [(n, p) for p in range(1, 7) for n in range(p, 13)]
CALLS = [(n, r, p) for n, p in SPLITS for r in range(p)]
PIPELINES = ["one micro-batch", "uneven layers, seed 7", "more micro-batches than stages"]


def cases(ctx):
    calls = [{"exercise": QID, "args": list(c)} for c in CALLS]
    return [ctx.case(QID, "units", calls=calls, label="splits")] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    ref = ctx.reference_fn(QID)
    results = dict(zip(CALLS, unit_results(QID, units, CALLS)))
    items = []
    for n, p in SPLITS:
        item = Item("splits", f"{n} layers on {p} stages")
        for r in range(p):
            want, exc = call_reference(ref, (n, r, p), {})
            got = results[(n, r, p)]
            if not same_result(got, want, exc):
                item.problems.append(Problem(QID, f"distribute_layers({n}, {r}, {p}) {describe_result(got)}; "
                                                  f"expected {want}", r))
                break
        items.append(item)
    return items + [pipeline_item(QID, ctx, o) for o in pipes]
