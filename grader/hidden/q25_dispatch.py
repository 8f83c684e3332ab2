"""Hidden tests of q25 (dispatch, with route, combine and sync_gradients): the lab's MoE model (2 MoE layers, float64)
on expert-parallel meshes of 2 and 4 ranks, one and two experts per rank, top-1 and top-2, with and without a capacity
that drops assignments, a rank of experts that receives no token, and ep x dp = 2 x 2; three SGD steps each; judged
by topics/experts/judge.py; and the graded prediction.

Six parts, each a sixth of the points (an item per case):
    forward     step 0's logits equal one process's MoE
    gradients   every gradient after sync_gradients equals one process's (a wrong scale named by its factor)
    training    the ranks' mean loss over three SGD steps is one process's curve
    traffic     one counts exchange and two all-to-alls of tokens per layer forward, two backward; their bytes sent
                off-rank exactly what the rule's kept assignments need
    routing     the dropped assignments, how many and which, are the rule's
    prediction  bytes per rank per layer forward and backward, and the factor of undivided experts' gradients
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab_src.judge.numeric import matches
from lab_src.judge.problems import Problem, stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.experts.judge import judge_run
from lab_src.topics.experts.moe import Routing
from lab_src.topics.experts.records import PARTS, PREDICTION_KEYS, PREDICTION_NAME, capacity, prediction_wanted

from .common import Item, case_problems, read_prediction

QID = "q25"


def _cfg(seed: int, **kw) -> LabConfig:
    return LabConfig(**{"num_layers": 2, "hidden_size": 16, "num_heads": 2, "seq_len": 8, "vocab_size": 32,
                        "num_stages": 1, "dtype": "float64", "seed": seed, **kw})


# label -> (configuration, ranks, settings): simplest first
CASES = {
    "ep = 2, one expert a rank, top-1": (_cfg(81), 2, {"ep": 2, "experts": 2, "k": 1}),
    "ep = 2, two experts a rank, top-2, capacity 1.0 (drops)": (
        _cfg(82), 2, {"ep": 2, "experts": 4, "k": 2, "capacity_factor": 1.0}),
    "ep = 2, two experts a rank, top-2, rank 1's experts receive no token": (
        _cfg(83), 2, {"ep": 2, "experts": 4, "k": 2, "starve": True}),
    "ep = 4, one expert a rank, top-2, capacity 1.25": (
        _cfg(84), 4, {"ep": 4, "experts": 4, "k": 2, "capacity_factor": 1.25}),
    "ep = 2 x dp = 2, two experts a rank, top-2, capacity 1.5": (
        _cfg(85), 4, {"ep": 2, "experts": 4, "k": 2, "capacity_factor": 1.5}),
}


def route_rule(x, router, k: int, capacity_factor: float) -> Routing:
    """The rule the routing is compared with (the grader's: the student package holds none): the top k of the
    router's softmax, their probabilities as weights; a capacity per expert of this rank's assignments, taken choice
    by choice (every first choice in token order, then every second)."""
    scores = torch.softmax(router(x), dim=-1)
    top_w, top_e = scores.topk(k, dim=-1)
    cap = capacity(x.shape[0], k, router.out_features, capacity_factor)
    keep = torch.ones_like(top_e, dtype=torch.bool)
    if cap is not None:
        queue = F.one_hot(top_e.t().reshape(-1), router.out_features)
        place = (queue.cumsum(0) * queue).sum(-1) - 1       # the assignment's place in its expert's queue
        keep = (place < cap).reshape(k, -1).t()
    return Routing(top_e, top_w, keep, router.out_features)


def cases(ctx):
    return [ctx.case(QID, "moe", cfg, stages=ranks, label=label, settings=settings, schedule="", step="")
            for label, (cfg, ranks, settings) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = None if failed else judge_run(out, route_rule)
        items += [Item(part, label, list(failed) if failed else stamped(found[part], QID, label)) for part in PARTS]
    return items + prediction_items(ctx)


def prediction_items(ctx) -> list[Item]:
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
            if k != "undivided_factor" and matches(got[k], want[k] * 4 / 3):
                why = " (that counts the rows a rank sends itself too: they never leave it)"
            elif k != "undivided_factor" and matches(got[k], want[k] / 2):
                why = " (the dispatch alone: the combine sends as many rows back)"
            item.problems.append(Problem(f"the predicted {k!r} is {got[k]:,.6g}; it is {want[k]:,.6g}{why}",
                                         exercise=QID))
    return items
