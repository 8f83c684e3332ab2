"""Hidden tests of q03 (activation_shape): the shape for several model configurations, then full
pipelines whose receive buffers are allocated with the student's shape."""
from lab_src.pipeline.config import DEMO, LabConfig

from .common import CONFIGS, pipeline_item, unit_items, units_case

QID = "q03"
CALLS = [((cfg, mbs), {}) for cfg, mbs in [
    (CONFIGS["one micro-batch"], 4), (LabConfig(hidden_size=48, seq_len=10, vocab_size=100), 3), (DEMO, 4),
    (LabConfig(num_heads=2, hidden_size=16, seq_len=8, num_layers=3), 1), (CONFIGS["float64, seed 123"], 2)]]
PIPELINES = ["more micro-batches than stages", "float64, seed 123", "fewer micro-batches than stages"]


def shape_case(args, kwargs) -> str:
    cfg, mbs = args
    return f"hidden {cfg.hidden_size}, seq {cfg.seq_len}, vocab {cfg.vocab_size}, micro-batch {mbs}"


def cases(ctx):
    return [units_case(ctx, QID, "shapes", CALLS)] + [ctx.case(QID, "pipeline", c) for c in PIPELINES]


def judge(ctx, outcomes):
    units, *pipes = outcomes
    return unit_items(ctx, QID, units, CALLS, group=shape_case) + [pipeline_item(QID, ctx, o) for o in pipes]
