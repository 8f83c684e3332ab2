"""Hidden tests of q03 (activation_shape): the shape for several model configurations, then full
pipelines whose receive buffers are allocated with the student's shape."""
from lab_src.config import DEMO, LabConfig
from lab_src.problems import Problem

from .common import CONFIGS, Item, call_reference, describe_result, pipeline_item, same_result, unit_results

QID = "q03"
SHAPES = [(CONFIGS["one micro-batch"], 4), (LabConfig(hidden_size=48, seq_len=10, vocab_size=100), 3),
          (DEMO, 4), (LabConfig(num_heads=2, hidden_size=16, seq_len=8, num_layers=3), 1),
          (CONFIGS["float64, seed 123"], 2)]
PIPELINES = ["more micro-batches than stages", "float64, seed 123", "fewer micro-batches than stages"]


def cases(ctx):
    calls = [{"exercise": QID, "args": [{"$cfg": cfg.to_dict()}, mbs]} for cfg, mbs in SHAPES]
    return [ctx.case(QID, "units", calls=calls, label="shapes")] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    ref = ctx.reference_fn(QID)
    items = []
    for (cfg, mbs), got in zip(SHAPES, unit_results(QID, units, SHAPES)):
        want, exc = call_reference(ref, (cfg, mbs), {})
        name = f"activation_shape(hidden {cfg.hidden_size}, seq {cfg.seq_len}, vocab {cfg.vocab_size}, micro-batch {mbs})"
        item = Item("shapes", name)
        if not same_result(got, list(want), exc):
            item.problems.append(Problem(QID, f"{name} {describe_result(got)}; expected {tuple(want)}"))
        items.append(item)
    return items + [pipeline_item(QID, ctx, o) for o in pipes]
