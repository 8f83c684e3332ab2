"""Hidden tests of q02 (check_args): valid and invalid configurations called directly, then full
pipelines whose micro-batch size comes from the student's answer."""
from lab_src.problems import Problem

from .common import Item, call_reference, describe_result, pipeline_item, same_result, unit_results

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
    calls = [{"exercise": QID, "args": list(a), "kwargs": k} for a, k in CALLS]
    return [ctx.case(QID, "units", calls=calls, label="calls")] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    ref = ctx.reference_fn(QID)
    items = []
    for (args, kwargs), got in zip(CALLS, unit_results(QID, units, CALLS)):
        want, exc = call_reference(ref, args, kwargs)
        name = f"check_args{args}" + (" with allow_uneven_layers=True" if kwargs else "")
        item = Item("calls", name)
        if not same_result(got, want, exc):
            hint = (" (raise ValueError: `python -O` removes assert statements)"
                    if got.get("type") == "AssertionError" else "")
            item.problems.append(Problem(QID, f"{name} {describe_result(got)}; expected "
                                              f"{'a ValueError' if exc else repr(want)}{hint}"))
        items.append(item)
    return items + [pipeline_item(QID, ctx, o) for o in pipes]
