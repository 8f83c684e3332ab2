"""Hidden tests of q23 (recompute_block): the answer's three modes (none, selective, full) on the lab's block with
dropout on, one rank a case, four shapes in float32 and bfloat16 (long sequences where the s^2 terms dominate, a wide
block where the sbh terms do, another seed and dropout rate), judged by topics/long_sequences/judge.py; and the
graded prediction.

Then the answer cell's `sp_block` (sequence parallelism on the tensor-parallel block) on t = 2 and t = 4 ranks in
float64, dropout off and on, and on t = 2 in bfloat16 at a longer sequence (its bytes and collectives only), judged
by topics/long_sequences/judge_sp.py.

Nine parts, each a ninth of the points:
    gradients       the outputs and gradients over micro-batches in flight (forward A, forward B, backward B, backward
                    A, forward C) are the plain block's, computed by the judge (an item per case and mode)
    memory          the bytes the forward left alive (the lab's count) are the mode's closed form
    flops           the matmul FLOPs the backward adds: none, the attention core's at most, one forward
    prediction      bytes kept per mode at b = 4, s = 256, h = 64, 8 heads, bfloat16, and per rank at t = 4 with
                    tensor parallelism and with sequence parallelism (predicted_sp_saved_bytes)
    sp_values       each rank's positions of the output and the input's gradient, and its shards' gradients,
                    against one process's block (an item per case and dropout off / on)
    sp_replicated   the replicated parameters' gradients (LayerNorms, proj's and down's biases) one process's on
                    every rank: summed over the tensor-parallel group
    sp_memory       the bytes each rank saved for its backward (dropout on) are the sequence-parallel closed form
    sp_traffic      each rank's all-gathers and reduce-scatters, each one's bytes, per the formula (an item per case)
    sp_training     the digits model trained with sp_block on t = 2 ranks (dropout 0.1, the embedding changed by a
                    seed only the run knows) follows one process's curve within q13's tolerance, the replicated
                    parameters identical on the ranks after training
"""
from __future__ import annotations

from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.judge import PARTS, judge_run
from lab_src.topics.long_sequences.judge_sp import judge_sp, sp_training
from lab_src.topics.training.digits import DIGITS
from lab_src.topics.long_sequences.records import (
    MODES,
    PREDICTION_KEYS,
    PREDICTION_NAME,
    SP_PARTS,
    SP_PREDICTION_KEYS,
    SP_PREDICTION_NAME,
    SP_PREDICTION_T,
    prediction_wanted,
    sp_prediction_wanted,
)

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

# sequence parallelism: label -> (configuration, t, settings)
SP_CASES = {
    "sp_block, t = 2, float64": (
        LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64", seed=71), 2, {}),
    "sp_block, t = 4, float64, b = 3": (
        LabConfig(num_stages=4, global_batch_size=6, num_microbatches=2, dtype="float64", seed=72), 4, {}),
    "sp_block, t = 2, bfloat16, b = 2, s = 128, h = 64, 4 heads": (
        LabConfig(hidden_size=64, num_heads=4, seq_len=128, global_batch_size=2, num_microbatches=1, num_stages=2,
                  seed=73), 2, {"parts": ["dropout"], "dtype": "bfloat16", "values": False}),
}
SP_WHAT = {"block": "dropout off", "dropout": "dropout on"}
# the digits model trained with sp_block: label -> (configuration, t)
SP_TRAINING = {"sp_block training, t = 2, dropout 0.1": (DIGITS.replace(num_stages=1, dropout=0.1, dropout_shards=2), 2)}
SP_STEPS, SP_LR = 20, 1e-2


def cases(ctx):
    return [ctx.case(QID, "recompute", cfg, stages=1, label=label, settings=settings, schedule="", step="")
            for label, (cfg, settings) in CASES.items()] + \
        [ctx.case(QID, "sp_block", cfg, stages=t, label=label, settings=settings)
         for label, (cfg, t, settings) in SP_CASES.items()] + \
        [ctx.case(QID, "sp_train", cfg, stages=t, label=label,
                  settings={"steps": SP_STEPS, "lr": SP_LR, "perturb": True})
         for label, (cfg, t) in SP_TRAINING.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        if out.case.kind == "sp_block":
            items += sp_items(out, label, list(failed))
            continue
        if out.case.kind == "sp_train":
            right = all(i.passed for i in items if i.part == "sp_values")
            items.append(Item("sp_training", label, list(failed) or stamped(sp_training(out, right), QID, label)))
            continue
        found = None if failed else judge_run(out)
        items += [Item(part, f"{label}, {mode}", list(failed) if failed else stamped(found[part][mode], QID, label))
                  for part in PARTS for mode in MODES]
    return items + prediction_items(ctx) + sp_prediction_items(ctx)


def sp_items(out, label: str, failed: list) -> list[Item]:
    """The sequence-parallel case's items: values and the replicated gradients per part (dropout off, on) where the
    case judges values, the memory of the part with dropout, the traffic of the case; each failed alike when the
    case did not complete."""
    settings = out.case.settings or {}
    items = []
    for part in settings.get("parts") or SP_PARTS:
        judged = (("values", "replicated") if settings.get("values", True) else ()) + \
            (("memory",) if part == "dropout" else ())
        found = {} if failed else judge_sp(out, parts=[part])
        items += [Item(f"sp_{j}", f"{label}, {SP_WHAT[part]}", failed or stamped(found[j], QID, label))
                  for j in judged]
    found = {} if failed else judge_sp(out)
    return items + [Item("sp_traffic", label, failed or stamped(found["traffic"], QID, label))]


def prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        return f"the predicted {k!r} is {got:,.0f} B; the block keeps {want:,.0f} B under {k!r} at that shape"
    return judge_prediction(ctx, QID, PREDICTION_NAME, prediction_wanted(), wrong, PREDICTION_KEYS)


def sp_prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        paper = {"tensor_parallel": "sbh (10 + 24/t + 5 as/(ht))", "sequence_parallel": "sbh/t (34 + 5 as/h)"}[k]
        said = (f"the predicted {k.replace('_', ' ')} bytes per rank are {got:,.0f} B; one of t = {SP_PREDICTION_T} "
                f"ranks keeps {want:,.0f} B at that shape")
        return said + (f" (the paper's {paper} with 1-byte masks is another count: the lab's masks are 2 bytes, its "
                       f"LayerNorms keep their statistics, the causal mask is s^2 bytes)"
                       if got < want else "")
    return judge_prediction(ctx, QID, SP_PREDICTION_NAME, sp_prediction_wanted(), wrong, SP_PREDICTION_KEYS)
