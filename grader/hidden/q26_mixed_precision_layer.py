"""Hidden tests of q26 (mixed_precision_layer, LossScaler): 2 and 4 data-parallel ranks, bfloat16 and float16 (the
answer's LossScaler, growth every 2 clean steps, the lab's inf in one rank's shard gradient at one step), blocks
whose parameters do not divide by n (hidden 18: 4,050 parameters a block), five or six SGD steps each; judged by
topics/mixed_precision/judge.py against one process computing the same casts; and the graded prediction.

Parts per case (records.py PARTS): gradients, training, bytes, dtypes, and in float16 scaling; then the prediction's
three figures. Each item counts alike.
"""
from __future__ import annotations

from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.mixed_precision.judge import judge_run
from lab_src.topics.mixed_precision.records import PARTS, PREDICTION_KEYS, PREDICTION_NAME, prediction_wanted

from .common import Item, case_problems, judge_prediction

QID = "q26"
SMALL = LabConfig(hidden_size=16, num_heads=2, seq_len=8, num_stages=1)
UNEVEN = LabConfig(hidden_size=18, num_heads=3, seq_len=8, num_stages=1)     # 4,050 parameters: not a multiple of 4
# label -> (configuration, ranks, settings). Simplest first
CASES = {
    "bf16, n = 2": (SMALL.replace(seed=91), 2, {"dtype": "bfloat16", "steps": 5}),
    "bf16, n = 4, hidden 18 (uneven shards)": (UNEVEN.replace(seed=92), 4, {"dtype": "bfloat16", "steps": 5}),
    "fp16, n = 2, an inf on rank 0 at step 1": (SMALL.replace(seed=93), 2, {
        "dtype": "float16", "steps": 6, "growth_interval": 2, "inject_step": 1, "inject_rank": 0}),
    "fp16, n = 4, hidden 18, an inf on rank 2 at step 3": (UNEVEN.replace(seed=94), 4, {
        "dtype": "float16", "steps": 6, "growth_interval": 2, "inject_step": 3, "inject_rank": 2, "blocks": 3}),
}


def cases(ctx):
    return [ctx.case(QID, "mixed_precision", cfg, stages=n, label=label, settings=settings, step="", schedule="")
            for label, (cfg, n, settings) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        parts = [p for p in PARTS if p != "scaling" or out.case.settings.get("dtype") == "float16"]
        failed = case_problems(QID, out, label)
        found = {p: [] for p in parts} if failed else judge_run(out)
        items += [Item(part, label, list(failed) + stamped(found[part], QID, label)) for part in parts]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        why = ""
        if k == "gather" and abs(got - 2 * want) < 1e-3 * want:
            why = " (float32's bytes: the gather carries the cast, 2 bytes a parameter)"
        elif k in ("master", "bf16_only") and abs(got - 4 * want) < 1e-3 * want:
            why = " (the whole stage's: a rank keeps its 1/4 shard)"
        return f"the predicted {k!r} is {got:,.0f}; it is {want:,.0f}{why}"
    return judge_prediction(ctx, QID, PREDICTION_NAME, prediction_wanted(), wrong, PREDICTION_KEYS)
