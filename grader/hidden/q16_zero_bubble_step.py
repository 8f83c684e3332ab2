"""Hidden tests of q16 (zero_bubble_step, with the answer cell's backward_input and backward_weight).

Two parts of equal weight:
- "split": the two halves on every stage of a 3-stage float64 model and of a single stage (tokens in, loss
  out), each on one rank against one backward() (topics/zero_bubble/kind.py, topics/zero_bubble/judge.py): the gradients
  (1e-12, added to what .grad held), the work done once (I + W within 5 % of one backward's floating-point
  operations) and nothing left held after W;
- "pipelines": full ZB-H1 pipelines of 1 to 4 stages, 1 to 6 micro-batches, m < p, uneven layers, float64
  and other seeds (common.CONFIGS), compared with the baseline, checked to be real pipelines and judged
  against the "zbh1" schedule from the recorded events: every W after its I, the gradient sent before the
  rank computes anything else, at most min(p, m) micro-batches held from forward to W, 1F1B's order of
  forwards and I's, and where the W's go (rank r's W of backward k right after its I of backward k + r).
  A correct One-Forward-One-Backward step, whole backwards or each W right after its own I ("1f1b_split":
  no W delayed, no bubble filled), keeps the exercise's `other_schedule_credit` of each pipeline where it
  differs from ZB-H1, with a message saying what zero bubble moves.
The split cases run on one rank each, in the launch the pipelines run in."""
from lab_src.topics.zero_bubble import judge as split
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig

from .common import Item, case_problems, causes_first, pipeline_cases, pipeline_item

QID = "q16"

SPLIT = {
    "split, 3 stages, float64": LabConfig(num_stages=3, num_layers=4, num_microbatches=1, global_batch_size=2,
                                          dtype="float64", seed=5),
    "split, a single stage, float64": LabConfig(num_stages=1, num_layers=2, num_microbatches=1,
                                                global_batch_size=2, dtype="float64", seed=11),
}


def cases(ctx):
    # the split first: one rank each, and a step that deadlocks twice stops q16's later cases
    return [ctx.case(QID, "split", cfg, stages=1, label=label) for label, cfg in SPLIT.items()] + \
        pipeline_cases(ctx, QID)


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        if out.case.kind != "split":
            items.append(causes_first(pipeline_item(QID, ctx, out)))
            continue
        errs = case_problems(QID, out, label)
        obs, dtype = out.obs.get(0, {}), out.case.config.dtype
        for name, judged in (("gradients", split.numbers(obs, dtype)), ("computed once", split.once(obs)),
                             ("memory freed after W", split.freed(obs))):
            items.append(Item("split", f"{label}: {name}", errs or stamped(judged, QID, label)))
    return items
