"""Hidden tests of q27 (load_sharded, with save_sharded): q21's sharded AdamW state of the lab's model (105,913
parameters: N % 3 = 1, N % 4 = 1, so that torch.tensor_split's shards are uneven and differ from torch.chunk's)
after two steps, saved on n ranks and loaded on m: 4 -> 2, 4 -> 3, 4 -> 4, 2 -> 4, 3 -> 4 (float32), and 4 -> 3 in
float64 (N = 28,909); q21's step is the reference's. Judged by topics/checkpoint/judge.py.

Five parts, each a fifth of the points (an item per case):
    written    the folder's files hold the state once (3 N e bytes), plus at most 4 KiB of metadata per saving rank,
               measured by the grader itself
    read       each loading rank's process read its slices, plus the metadata and 8 KiB of buffering a file
    state      what load_sharded returned is the saved elements of the rank's new shard and the step, bitwise
    continues  the next step from it equals the step from the state handed over in memory on the same m ranks
               (bitwise) and the uninterrupted run on n ranks (within q21's tolerance)
    prediction rank 1 of 3 after a save on 4, N = 1,000,000 float32: its bytes read, the old files it opens, and the
               bytes of those files whole
"""
from __future__ import annotations

from lab_src.judge.numeric import matches
from lab_src.judge.problems import Problem, stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.checkpoint.judge import PARTS, judge_run
from lab_src.topics.checkpoint.records import PREDICTION_KEYS, PREDICTION_NAME, prediction_wanted

from .common import Item, case_problems

QID = "q27"


def _cfg(seed: int, **kw) -> LabConfig:
    return LabConfig(**{"num_stages": 1, "num_layers": 8, "vocab_size": 57, "global_batch_size": 12, "seed": seed,
                        **kw})


# label -> (configuration, n, m): simplest first
CASES = {
    "saved on 4, loaded on 2": (_cfg(71), 4, 2),
    "saved on 4, loaded on 3": (_cfg(72), 4, 3),
    "saved on 4, loaded on 4": (_cfg(73), 4, 4),
    "saved on 2, loaded on 4": (_cfg(74), 2, 4),
    "saved on 3, loaded on 4": (_cfg(75), 3, 4),
    "saved on 4, loaded on 3, float64": (_cfg(76, num_layers=2, vocab_size=45, dtype="float64"), 4, 3),
}


def cases(ctx):
    return [ctx.case(QID, "checkpoint", cfg, stages=max(n, m), label=label, settings={"save": n, "load": m},
                     schedule="", step="")
            for label, (cfg, n, m) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = None if failed else judge_run(out)
        items += [Item(part, label, list(failed) if failed else stamped(found[part], QID, label)) for part in PARTS]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
    from .common import read_prediction
    want = prediction_wanted()
    items = [Item("prediction", k) for k in want]
    got = read_prediction(ctx, QID, PREDICTION_NAME, items, PREDICTION_KEYS)
    if got is None:
        return items
    for item in items:
        k = item.name
        if k not in got:
            item.problems.append(Problem(f"{PREDICTION_NAME}() gives no {k!r} entry", exercise=QID))
        elif not matches(got[k], want[k]):
            why = ""
            if k == "bytes_rank1" and matches(got[k], want[k] / 3):
                why = " (one tensor's slice: the parameters and both moments are read)"
            elif k == "whole_files_rank1" and matches(got[k], 4_000_000 * 3):
                why = " (that is every file: rank 1 overlaps only some of the old shards)"
            item.problems.append(Problem(f"the predicted {k!r} is {got[k]:,.6g}; it is {want[k]:,.6g}{why}",
                                         exercise=QID))
    return items
