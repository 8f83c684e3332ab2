"""Hidden tests of q21 (sharded_adamw_step): the answer's sharded AdamW step on 2 and 4 data-parallel ranks and a
2 x 2 data x pipeline grid, stages whose parameters do not divide by n, float32 and float64, AdamW's settings passed
as arguments (torch's defaults, and others in one case), three steps each after the replica's 1F1B step (the
reference's), judged by topics/sharding/judge.py; and the graded prediction.

Four parts, each a quarter of the points:
    values      per case: every replica's parameters after each step equal one process's torch.optim.AdamW
    memory      per case: `state` holds one shard's moments, not the whole stage's; no gradient left held
    messages    per case: point-to-point only, to the ring's neighbours, 2(n - 1)/n of the parameters' bytes
    prediction  bytes per rank of data parallel, ZeRO-1 and ZeRO-2 for the default model on 4 ranks, and sent
"""
from __future__ import annotations

from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.sharding.judge import judge_run
from lab_src.topics.sharding.records import (
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_PARAMS,
    PREDICTION_RANKS,
    zero_wanted,
)

from .common import Item, case_problems, judge_prediction

QID = "q21"
# label -> configuration; every case runs on 4 ranks (dp_size x num_stages). Simplest first, the uneven shards last
# (a launch stops trying an exercise after two of its cases failed to finish: harness/runner.py)
CASES = {
    "n = 2, 2 ranks per stage of a 2 x 2 grid": LabConfig(num_stages=2, num_layers=4, num_microbatches=4,
                                                           global_batch_size=16, dp_size=2, seed=51),
    "n = 4, float64, betas (0.8, 0.95), eps 1e-06, weight_decay 0.1":
        LabConfig(num_stages=1, num_layers=2, num_microbatches=1, global_batch_size=8, dp_size=4, seed=54,
                  dtype="float64"),
    "n = 4, 29,949 parameters (uneven shards)": LabConfig(num_stages=1, num_layers=2, vocab_size=61,
                                                          num_microbatches=2, global_batch_size=16, dp_size=4, seed=52),
    "n = 2 x 2, uneven stages, m = 8": LabConfig(num_stages=2, num_layers=4, vocab_size=67, seq_len=15,
                                                 num_microbatches=8, global_batch_size=32, dp_size=2, seed=53),
}
# AdamW's settings of a case, beside lr (torch's defaults where a case names none): one case passes others, as
# another course's tests or a training would, so that an answer must take them from its arguments
ADAMW = {"n = 4, float64, betas (0.8, 0.95), eps 1e-06, weight_decay 0.1":
         {"betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}
PARTS = ("values", "memory", "messages")


def cases(ctx):
    return [ctx.case(QID, "zero", cfg, stages=4, label=label, settings={"steps": 3, **ADAMW.get(label, {})},
                     schedule="1f1b", step="q12")
            for label, cfg in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = {p: [] for p in PARTS} if failed else judge_run(out)
        items += [Item(part, label, list(failed) + stamped(found[part], QID, label)) for part in PARTS]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    p = PREDICTION_PARAMS * 4

    def wrong(k, got, want):
        return (f"the predicted {k!r} is {got:,.0f} B; it is {want:,.0f} B ({want / p:g} x the parameters' {p:,} B on "
                f"{PREDICTION_RANKS} ranks)")
    return judge_prediction(ctx, QID, PREDICTION_NAME, zero_wanted(), wrong, PREDICTION_KEYS)
