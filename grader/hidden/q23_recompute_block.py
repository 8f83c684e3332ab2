"""Hidden tests of q23 (recompute_block): the answer's three modes (none, selective, full) on the lab's block with
dropout on, one rank a case, four shapes in float32 and bfloat16 (long sequences where the s^2 terms dominate, a wide
block where the sbh terms do, another seed and dropout rate), judged by topics/long_sequences/judge.py; and the
graded prediction.

Four parts, each a quarter of the points (an item per case and mode):
    gradients   the outputs and gradients over micro-batches in flight (forward A, forward B, backward B, backward
                A, forward C) are the plain block's, computed by the judge
    memory      the bytes the forward left alive (the lab's count) are the mode's closed form
    flops       the matmul FLOPs the backward adds: none, the attention core's at most, one forward
    prediction  bytes kept per mode at b = 4, s = 256, h = 64, 8 heads, bfloat16
"""
from __future__ import annotations

from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.judge import PARTS, judge_run
from lab_src.topics.long_sequences.records import MODES, PREDICTION_KEYS, PREDICTION_NAME, prediction_wanted

from .common import Item, case_problems, judge_prediction

QID = "q23"
# label -> (configuration, settings): simplest first
CASES = {
    "float32, b = 2, s = 128, h = 64, 4 heads": (
        LabConfig(hidden_size=64, num_heads=4, seq_len=128, dropout=0.1, seed=61, num_stages=1),
        {"batch": 2, "dtype": "float32"}),
    "bfloat16, b = 4, s = 256, h = 64, 8 heads": (
        LabConfig(hidden_size=64, num_heads=8, seq_len=256, dropout=0.1, seed=62, num_stages=1),
        {"batch": 4, "dtype": "bfloat16"}),
    "float32, b = 1, s = 192, h = 96, 6 heads, dropout 0.25": (
        LabConfig(hidden_size=96, num_heads=6, seq_len=192, dropout=0.25, seed=63, num_stages=1),
        {"batch": 1, "dtype": "float32"}),
    "bfloat16, b = 3, s = 64, h = 128, 2 heads": (
        LabConfig(hidden_size=128, num_heads=2, seq_len=64, dropout=0.1, seed=64, num_stages=1),
        {"batch": 3, "dtype": "bfloat16"}),
}


def cases(ctx):
    return [ctx.case(QID, "recompute", cfg, stages=1, label=label, settings=settings, schedule="", step="")
            for label, (cfg, settings) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = None if failed else judge_run(out)
        items += [Item(part, f"{label}, {mode}", list(failed) if failed else stamped(found[part][mode], QID, label))
                  for part in PARTS for mode in MODES]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        return f"the predicted {k!r} is {got:,.0f} B; the block keeps {want:,.0f} B under {k!r} at that shape"
    return judge_prediction(ctx, QID, PREDICTION_NAME, prediction_wanted(), wrong, PREDICTION_KEYS)
