"""Hidden tests of q18 (tp_block): the answer's tensor-parallel block on 2 and 4 ranks, in float64,
against the unsharded block (topics/tensor_parallel/judge_block.py), then the digits model trained with it (topics/tensor_parallel/judge_train.py),
and the student's predicted bytes of one training step, tensor parallel against pipeline.

Five parts, each a fifth of the points:
    block          dropout off: output, input gradient, every shard's gradients, what each rank holds, and
                   one all-reduce after each sub-layer forward and before each backward (t = 2, t = 4)
    dropout        dropout on: the same numbers, the masks reproducing the single process's, and in
                   evaluation mode (module.eval()) nothing dropped (t = 2, t = 4); at t = 2 also on two
                   tensor-parallel groups side by side (ranks [0, 2], [1, 3]: tp.rank is not the global rank)
    replicated     the LayerNorms identical on every rank after one AdamW step (each part, each t)
    training       the digits model trained with t = 2 (dropout on), and with t = 2 x p = 2 on 4 ranks
                   (tensor parallel inside pipeline stages), following one process's loss curve step by step
                   within q13's tolerance (1e-5 relative, float32); the grid's run has dropout off (its
                   micro-batches' masks are not slices of the whole batch's). In both, stage 0's ranks change
                   their embedding once built by an amount only the run knows (pipeline/perturb.py), and one
                   process trains the changed model: a curve computed outside the run does not follow it
    prediction     `predicted_bytes()` of the answer cell (parsed, never run): the bytes one training step of
                   the digits model moves with t = 2 and with p = 2, as the lab counts them (topics/tensor_parallel/traffic.py)
"""
from __future__ import annotations


from lab_src.judge.problems import stamped
from lab_src.topics.tensor_parallel.judge_block import judge_part
from lab_src.topics.tensor_parallel.judge_train import judge_training
from lab_src.pipeline.config import LabConfig
from lab_src.topics.training.digits import DIGITS
from lab_src.topics.tensor_parallel.traffic import PREDICTION, PREDICTION_NAME, expected_bytes

from .common import Item, case_problems, code_of, judge_prediction

QID = "q18"
BLOCKS = {
    "t = 2, float64": (2, LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64", seed=3)),
    "t = 4, float64, seed 11": (4, LabConfig(num_stages=4, global_batch_size=6, num_microbatches=2, dtype="float64",
                                             seed=11)),
}
# The dropout part once more on 4 ranks: two tensor-parallel groups of t = 2 side by side (ranks [0, 2] and [1, 3],
# as in the trainings' t x p grid), where a global rank is not the tensor-parallel one. Judged inside the items of
# the block on 2 ranks (its dropout and its LayerNorms): it says something only where that block was right.
GRID = "t = 2, two groups side by side, float64"
GRID_JOINS = "t = 2, float64"
STEPS, LR = 20, 1e-2
# name -> (configuration, t, ranks)
TRAINING = {
    "training, t = 2, dropout 0.1": (DIGITS.replace(num_stages=1, dropout=0.1, dropout_shards=2), 2, 2),
    "training, t = 2 x p = 2": (DIGITS.replace(num_stages=2), 2, 4),
}
TOLERANCE = 0.005   # a prediction within half a percent counts
HINTS = {
    "tensor_parallel": "each of the 4 blocks reduces the (batch, 64, 32) activation after its attention and after "
                       "its MLP in the forward, and the input's gradient before each in the backward: 4 all-reduces "
                       "per block, and each of the t ranks hands its whole buffer to each",
    "pipeline": "one boundary between the 2 stages: each of the 4 micro-batches' activation (batch/4, 64, 32) "
                "goes forward once and its gradient back once",
}


_CODE = ("lab_src.pipeline.config", "lab_src.pipeline.model", "lab_src.pipeline.dropout", "lab_src.topics.training.digits",
         "lab_src.topics.training.classifier", "lab_src.topics.training.single_process",
         "lab_src.topics.tensor_parallel.records")


def single_process_curve(cfg) -> list[float]:
    """One process's curve for a training case, kept in the grader's own cache (grader/reference.py, as q13
    keeps its own) under a hash of the configuration, the code it runs and torch's version: a course's
    grading trains it once, not once per student."""
    import hashlib
    import json
    import os

    import torch

    from lab_src.topics.tensor_parallel.judge_train import single_process

    from ..reference import cache_root
    blob = json.dumps([cfg.to_dict(), STEPS, LR, torch.__version__]).encode()
    blob += code_of(_CODE)
    folder = cache_root() / "q18-single-process"
    path = folder / f"{hashlib.sha256(blob).hexdigest()[:20]}.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except ValueError:      # a damaged file is recomputed
            pass
    curve = single_process(cfg, STEPS, LR)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(curve))
    os.replace(tmp, path)
    return curve


def cases(ctx):
    out = [ctx.case(QID, "tp_block", cfg, stages=t, label=label) for label, (t, cfg) in BLOCKS.items()]
    out += [ctx.case(QID, "tp_train", cfg, stages=n, label=label,
                     settings={"t": t, "steps": STEPS, "lr": LR, "perturb": True})
            for label, (cfg, t, n) in TRAINING.items()]
    out.append(ctx.case(QID, "tp_block", BLOCKS[GRID_JOINS][1], stages=4, label=GRID,
                        settings={"parts": ["dropout"], "replicas": 2}))
    return out


def judge(ctx, outcomes):
    items, grid = [], None
    for out in outcomes:
        label = out.case.label
        if label == GRID:
            grid = out
            continue
        failed = list(stamped(case_problems(QID, out, label), QID, label))
        if out.case.kind == "tp_train":
            found = {"curves": [], "replicated": []} if failed else \
                judge_training(out, STEPS, LR, unchanged=single_process_curve(out.case.config),
                               block_right=block_right(items))
            items.append(Item("training", label, failed + stamped(found["curves"] + found["replicated"], QID, label)))
            continue
        for part in ("block", "dropout"):
            found = {"numbers": [], "replicated": [], "communication": [], "holds": []} if failed else \
                judge_part(part, out, block_right=block_right(items, label) if part == "dropout" else None)
            items.append(Item(part, label, failed + stamped(found["holds"] + found["numbers"] + found["communication"],
                                                            QID, label)))
            items.append(Item("replicated", f"{part}, {label}", failed + stamped(found["replicated"], QID, label)))
    if grid is not None:
        grid_into(items, grid, block_right(items))
    return items + prediction_items(ctx)


def block_right(items: list[Item], label: str | None = None) -> bool:
    """Whether the block without dropout passed (in case `label`, or in every case judged so far): where it did
    not, what the dropout part and the training show follows from it (issue 41: one cause, named once)."""
    return all(i.passed for i in items if i.part == "block" and (label is None or i.name == label))


def grid_into(items: list[Item], out, block_right: bool = True) -> None:
    """The grid case's problems, added to the items of the dropout part on 2 ranks where those passed: a mistake
    only the grid shows (the shards' streams seeded from the global rank) fails them; a mistake the 2 ranks show
    already is not counted twice."""
    failed = list(stamped(case_problems(QID, out, GRID), QID, GRID))
    found = {"numbers": [], "replicated": [], "communication": [], "holds": []} if failed else \
        judge_part("dropout", out, block_right=block_right)
    numbers = next(i for i in items if i.part == "dropout" and i.name == GRID_JOINS)
    norms = next(i for i in items if i.part == "replicated" and i.name == f"dropout, {GRID_JOINS}")
    if numbers.passed:
        numbers.problems += failed + stamped(found["holds"] + found["numbers"] + found["communication"], QID, GRID)
    if norms.passed:
        norms.problems += failed + stamped(found["replicated"], QID, GRID)


def prediction_items(ctx) -> list[Item]:
    want = {"tensor_parallel": expected_bytes(PREDICTION, 2, 1)["tensor_parallel"],
            "pipeline": expected_bytes(PREDICTION, 1, 2)["pipeline"]}

    def wrong(k, got, want):
        ratio = f" ({got / want:.3g}x)" if want else ""
        return f"the predicted {k} bytes are {got:,.0f}; one step moves {want:,}{ratio}: {HINTS[k]}"
    return judge_prediction(ctx, QID, PREDICTION_NAME, want, wrong,
                            close=lambda got, want: abs(got - want) <= TOLERANCE * max(want, 1))
