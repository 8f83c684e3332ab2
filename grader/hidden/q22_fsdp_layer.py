"""Hidden tests of q22 (fsdp_layer): the answer's module wrapping every block of the stages on 2 and 4 data-parallel
ranks and a 2 x 2 grid, blocks whose parameters do not divide by n, float32 and float64, three steps of 1F1B (the
reference's) and SGD each; then two trainings of the digit classifier (n = 2 on a 2 x 2 grid, n = 4), 15 AdamW
steps each; judged by topics/sharding/judge_fsdp.py; and the graded prediction.

Four parts, each a quarter of the points:
    values      per case: every whole gradient after each step equal one process's; in a training, the replicas'
                mean loss at every step on one process's curve (q13's tolerance)
    memory      per case: at rest the shards only; at most two layers gathered at once; none left after a step
    counts      per case: per block and step, 2m gathers and m reduce-scatters
    prediction  the bytes at rest and at a forward's peak, and the gathers per step, for 4 default blocks on 4 ranks
"""
from __future__ import annotations

from lab_src.judge.numeric import matches
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.sharding.judge_fsdp import few_gathers_follow, judge_run
from lab_src.topics.sharding.records import FSDP_PREDICTION, FSDP_PREDICTION_BLOCKS, FSDP_PREDICTION_KEYS, fsdp_wanted
from lab_src.topics.training.digits import DIGITS

from .common import Item, case_problems, judge_prediction

QID = "q22"
# label -> configuration; every case runs on 4 ranks. Simplest first
CASES = {
    "n = 2, a 2 x 2 grid, m = 4": LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16,
                                             dp_size=2, seed=71),
    "n = 4, 4 blocks, float64": LabConfig(num_stages=1, num_layers=4, num_microbatches=2, global_batch_size=16,
                                          dp_size=4, seed=72, dtype="float64"),
    "n = 4, hidden 33 (13,497 parameters a block: uneven shards)": LabConfig(
        num_stages=1, num_layers=3, hidden_size=33, num_heads=3, num_microbatches=2, global_batch_size=16, dp_size=4,
        seed=73),
    # trainings of the digit classifier (topics/training), AdamW: the replicas' mean loss on one process's curve
    "digits, n = 2 on a 2 x 2 grid, 15 steps": DIGITS.replace(num_stages=2, dp_size=2, seed=74),
    "digits, n = 4, 15 steps": DIGITS.replace(num_stages=1, num_layers=2, dp_size=4, num_microbatches=2, seed=75),
}
TRAINING = {"digits": True, "steps": 15, "lr": 1e-2}
PARTS = ("values", "memory", "counts")


def cases(ctx):
    return [ctx.case(QID, "fsdp", cfg, stages=4, label=label,
                     settings=dict(TRAINING) if label.startswith("digits") else {"steps": 3},
                     schedule="1f1b", step="q12")
            for label, cfg in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = {p: [] for p in PARTS} if failed else judge_run(out)
        items += [Item(part, label, list(failed) + stamped(found[part], QID, label)) for part in PARTS]
    # too few gathers in a case whose memory part saw no copy kept follow from the copies another case saw kept
    for item, problems in zip(items, few_gathers_follow([item.problems for item in items])):
        item.problems = problems
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        why = (f" (that is the {FSDP_PREDICTION_BLOCKS} blocks' together; the prediction counts one block's)"
               if k == "gathers" and matches(got, FSDP_PREDICTION_BLOCKS * want) else "")
        return f"the predicted {k!r} is {got:,.0f}; it is {want:,.0f}{why}"
    return judge_prediction(ctx, QID, FSDP_PREDICTION, fsdp_wanted(), wrong, FSDP_PREDICTION_KEYS)
