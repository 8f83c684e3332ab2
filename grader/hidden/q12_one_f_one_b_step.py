"""Hidden tests of q12 (one_f_one_b_step): full pipelines of 1 to 4 stages, 1 to 6 micro-batches, uneven
layers, float64 and other seeds, and m <= p - 2 (4 stages, 2 micro-batches), compared with the baseline (outputs, loss, every stage's gradients),
checked to be real pipelines, and judged by One-Forward-One-Backward's rules from the recorded events:
rank r never holds more than min(p - r, m) micro-batches awaiting their backward, and runs 1F1B's order.
A valid All-Forward-All-Backward step keeps the exercise's `other_schedule_credit` of each case it
breaks 1F1B in; any other failure is explained in 1F1B's terms (warm-up, steady state, cool-down).
And the prediction of each rank's warm-up for p = 4 with m = 8 and m = 2 (predicted_warmup(), read from the
answer file, never run): one item among the pipelines."""
from pathlib import Path

from lab_src.judge.numeric import NotANumber, read_numbers
from lab_src.judge.one_f_one_b import PREDICTION_NAME, diagnose, prediction_problems
from lab_src.judge.problems import Kind, Problem, stamped
from lab_src.pipeline.config import LabConfig

from .common import Item, causes_first, pipeline_cases, pipeline_item

QID = "q12"

# 1F1B's own corner: m <= p - 2, where rank 0's warm-up is m, not p - r - 1 (a warm-up without min(., m)
# runs forwards for micro-batches that do not exist). It runs in the same launch as the shared configurations.
CORNERS = {
    "4 stages, 2 micro-batches": LabConfig(num_stages=4, num_layers=4, num_microbatches=2, global_batch_size=4),
}


def cases(ctx):
    ctx.baselines.add(CORNERS.values())
    return (pipeline_cases(ctx, QID) +
            pipeline_cases(ctx, QID, CORNERS))


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        item = pipeline_item(QID, ctx, out)
        if item.problems and not all(p.kind is Kind.WRONG_SCHEDULE for p in item.problems):
            item.problems[:0] = stamped(diagnose(out.events(), out.case.stages, out.case.microbatches), QID,
                                        out.case.label)
        items.append(causes_first(item))
    return items + [prediction_item(ctx)]


def prediction_item(ctx) -> Item:
    """The warm-up of each rank for p = 4, m = 8 and m = 2 (judge/one_f_one_b.py), read from the answer file."""
    path = ctx.student.get(QID)
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME) if path else {}
        problems = prediction_problems(got)
    except NotANumber as e:
        problems = [Problem(f"the prediction could not be read: {e}")]
    return Item("pipelines", "prediction", stamped(problems, QID, "prediction"))
