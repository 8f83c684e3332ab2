"""Hidden tests of q19 (ring_all_reduce): the answer's ring on 2, 3 and 4 ranks and on the data-parallel columns
of a 2 x 2 grid, over lengths from 1 element (fewer than ranks) to 4,194,305 (16 MiB: chunks of 4 MiB, which a
ring of blocking sends cannot pass without deadlocking), in float32 and float64, judged by
topics/data_parallel/judge.py; and the graded prediction.

Three parts, each a third of the points:
    sums          per case: every rank holds the sum of the inputs, and the same bits as the others
    ring          per case: no collective, messages to the ring's neighbours only, at most 2(n - 1) per rank,
                  none larger than a chunk (so about 2(n - 1)/n of the tensor per rank)
    prediction    the bytes each rank of a ring of 4 sends, on average, for each of the seed's four layers

Every case changes the ranks' inputs by noise from a seed drawn outside the answer (settings "perturb":
topics/data_parallel/kind.py), so the sums are those of the values the ranks held, never the configuration's alone.
"""
from __future__ import annotations

from lab_src.judge.numeric import matches
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.data_parallel.judge import judge_run, ring_errors
from lab_src.topics.data_parallel.records import PREDICTION_KEYS, PREDICTION_NAME, PREDICTION_RANKS, SEED_LAYERS, ring_bytes

from .common import Item, judge_prediction

QID = "q19"
# label -> (ranks, configuration (its seed and dtype), settings). Simplest first: a case that deadlocks or crashes
# twice stops the exercise's later cases (harness/runner.py), so the large tensor comes last
CASES = {
    "n = 2": (2, LabConfig(num_stages=2, seed=1), {"lengths": [1, 2, 7, 1000, 65_537]}),
    "n = 3": (3, LabConfig(num_stages=3, seed=2), {"lengths": [1, 2, 5, 1001, 100_003]}),
    "n = 4": (4, LabConfig(num_stages=4, seed=4), {"lengths": [1, 3, 4, 4099, 1_000_003]}),
    "n = 2 x 2, the columns of a grid": (4, LabConfig(num_stages=4, seed=5), {"lengths": [5, 100_003], "columns": 2}),
    "n = 4, float64": (4, LabConfig(num_stages=4, seed=6, dtype="float64"), {"lengths": [6, 65_537]}),
    "n = 4, 16 MiB": (4, LabConfig(num_stages=4, seed=7), {"lengths": [4_194_305]}),
}


def cases(ctx):
    return [ctx.case(QID, "ring", cfg, stages=n, label=label, settings={**settings, "perturb": True})
            for label, (n, cfg, settings) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = ring_errors(out, QID, label)
        found = {"sums": [], "ring": []} if failed else judge_run(out)
        items += [Item("sums", label, list(failed) + stamped(found["sums"], QID, label)),
                  Item("ring", label, list(failed) + stamped(found["ring"], QID, label))]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    def wrong(k, got, want):
        whole = SEED_LAYERS[k] * 4
        why = (" (the whole gradient: a ring sends every chunk n - 1 times in each of its two halves, "
               "2(n - 1)/n of the gradient from each rank)" if matches(got, whole) else
               f" ({PREDICTION_RANKS - 1} times the gradient: that is a ring passing the whole tensor)"
               if matches(got, (PREDICTION_RANKS - 1) * whole) else
               " (one half of the ring only: the reduce-scatter and the all-gather each send (n - 1)/n)"
               if matches(got, want / 2) else "")
        return (f"the predicted bytes for {k} are {got:,.0f}; each rank of a ring of {PREDICTION_RANKS} sends "
                f"{want:,.0f} on average for its {SEED_LAYERS[k]:,} float32 elements{why}")
    want = {k: ring_bytes(SEED_LAYERS[k], PREDICTION_RANKS) for k in SEED_LAYERS}
    return judge_prediction(ctx, QID, PREDICTION_NAME, want, wrong, PREDICTION_KEYS)
