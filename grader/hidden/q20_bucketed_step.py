"""Hidden tests of q20 (bucketed_step): the answer's Reducer and 1F1B step on 2 x 2, 1 x 4 and 4 x 1 grids (data x
pipeline), m = 4 and 8, three optimizer steps each, caps that make one bucket, several, and a parameter over the cap
alone, frozen parameters on one grid, float64 and tied embeddings on another, judged by topics/data_parallel/judge_buckets.py; the
Reducer's plans for the seed's MLP; and the graded prediction.

Five parts, each a fifth of the points:
    values      per case: every replica's gradients after each of the three steps equal one process's
    plan        per case: every stage's plan has the rule's properties; per cap, the seed's MLP's plan; the first
                case's item also holds the MLP's plan under a cap its first bucket meets exactly ("within the
                cap" includes it), judged where the plans are right otherwise (so no other answer's points move)
    rings       per case: one launch per bucket per step, of the plan's bytes, in the plan's order
    placement   per case: no launch before the stage's last backward; on the last stage, one before it ends
    prediction  the buckets of the seed's MLP under 1 MiB, 512 KiB and 64 KiB
"""
from __future__ import annotations

from lab_src.judge.numeric import matches
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.data_parallel.buckets import mlp_params
from lab_src.topics.data_parallel.judge_buckets import judge_run, mlp_plan_problems
from lab_src.topics.data_parallel.records import (
    BUCKET_PREDICTION,
    BUCKET_PREDICTION_KEYS,
    BUCKET_TOLERANCE,
    MLP_CAP_NAMES,
    MLP_CAPS,
    MLP_EXACT_CAP,
    SEED_MLP,
)

from .common import Item, case_problems, judge_prediction

QID = "q20"
FROZEN = ["embed.positions.weight", "blocks.0.attn_norm.bias"]
# label -> (configuration, settings); every case runs on 4 ranks. Simplest first (a case that deadlocks or crashes
# twice stops the exercise's later cases: harness/runner.py)
CASES = {
    "2 x 2, m = 4": (LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16, dp_size=2,
                               seed=21), {"cap": 40_000}),
    "1 x 4, m = 8": (LabConfig(num_stages=4, num_layers=4, num_microbatches=8, global_batch_size=16, seed=22),
                     {"cap": 40_000}),
    "4 x 1, m = 4, frozen parameters, a cap under a weight": (
        LabConfig(num_stages=1, num_layers=2, num_microbatches=4, global_batch_size=32, dp_size=4, seed=23),
        {"cap": 15_000, "freeze": FROZEN}),
    "2 x 2, m = 8, float64, tied embeddings, one bucket per stage": (
        LabConfig(num_stages=2, num_layers=4, num_microbatches=8, global_batch_size=32, dp_size=2, seed=24,
                  dtype="float64", tie_embeddings=True), {"cap": 1 << 20}),
}
CAP_NAMES = MLP_CAP_NAMES
PLAN_CAPS = [*MLP_CAPS, MLP_EXACT_CAP]        # the seed's MLP is planned under these in the first case
PARTS = ("values", "plan", "rings", "placement")


def cases(ctx):
    out = []
    for i, (label, (cfg, settings)) in enumerate(CASES.items()):
        extra = {"steps": 3, **settings, **({"mlp_caps": list(PLAN_CAPS)} if i == 0 else {})}
        out.append(ctx.case(QID, "buckets", cfg, stages=4, label=label, settings=extra, schedule="1f1b"))
    return out


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = {p: [] for p in PARTS} if failed else judge_run(out)
        if "mlp_caps" in out.case.settings and not failed and not found["plan"] and \
                not any(mlp_plan_problems(out.obs, cap) for cap in MLP_CAPS):
            found["plan"] += mlp_plan_problems(out.obs, MLP_EXACT_CAP)     # said only where nothing else is wrong
        items += [Item(part, label, list(failed) + stamped(found[part], QID, label)) for part in PARTS]
        if "mlp_caps" in out.case.settings:
            for cap in MLP_CAPS:
                problems = list(failed) or stamped(mlp_plan_problems(out.obs, cap), QID, "the seed's MLP")
                items.append(Item("plan", f"the seed's MLP, cap {CAP_NAMES[cap]}", problems))
    return items + prediction_items(ctx)


def mlp_buckets(cap: int) -> int:
    """How many buckets the rule makes of the seed's MLP under `cap` (what the prediction is judged against)."""
    count, size = 0, None
    for _, nbytes in reversed(mlp_params(SEED_MLP)):
        if size is None or size + nbytes > cap:
            count, size = count + 1, 0
        size += nbytes
    return count


def prediction_items(ctx) -> list[Item]:
    def wrong(name, got, want):
        return (f"the predicted buckets of the seed's MLP under {name} are {got:g}; the rule makes {want} (walk the "
                f"parameters from fc4.bias, close a bucket before the parameter that would take it over the cap, a "
                f"parameter over the cap alone)")
    want = {CAP_NAMES[cap]: mlp_buckets(cap) for cap in MLP_CAPS}
    return judge_prediction(ctx, QID, BUCKET_PREDICTION, want, wrong, BUCKET_PREDICTION_KEYS,
                            close=lambda got, want: matches(got, want, BUCKET_TOLERANCE))
