"""Hidden tests of q17 (tp_layers): the answer's tensor-parallel pieces on 2 and 4 ranks, in float64 (and
once in float32), against the unsharded layers and MLP of the lab's block (topics/tensor_parallel/judge_layers.py).

Four parts, each a quarter of the points:
    communication functions   CopyToTensorParallel and ReduceFromTensorParallel: outputs, gradients and
                              their one all-reduce (forward or backward), per configuration
    layers                    ColumnParallelLinear and RowParallelLinear: outputs, input gradients, the shard
                              each rank holds and its weight and bias gradients, their collectives
    MLP numbers               tp_layers' MLP: output, input gradient, every shard's gradients
    MLP communication         exactly one all-reduce of the activation in the forward and one in the backward
                              (kind, bytes, group), and each rank holding 1/t of the weights
"""
from __future__ import annotations

from lab_src.judge.problems import stamped
from lab_src.topics.tensor_parallel.judge_layers import causes_first, judge_part
from lab_src.pipeline.config import LabConfig

from .common import Item, case_problems

QID = "q17"
# (t ranks, configuration); the configuration's stages are not used: the case runs on t ranks
CONFIGS = {
    "t = 2, float64": (2, LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64", seed=3)),
    "t = 4, float64, seed 11": (4, LabConfig(num_stages=4, global_batch_size=6, num_microbatches=2, dtype="float64",
                                             seed=11)),
    "t = 4, float32, hidden 64": (4, LabConfig(num_stages=4, hidden_size=64, global_batch_size=2, num_microbatches=1)),
}


def cases(ctx):
    return [ctx.case(QID, "tp", cfg, stages=t, label=label) for label, (t, cfg) in CONFIGS.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        label = out.case.label
        failed = case_problems(QID, out, label)
        found = causes_first({part: ({"numbers": [], "communication": [], "holds": []} if failed else
                                     judge_part(part, out)) for part in ("copy", "reduce", "column", "row", "mlp")})

        def item(part_name: str, name: str, problems) -> Item:
            return Item(part_name, f"{name}, {label}", list(failed) + stamped(problems, QID, label))
        for part in ("copy", "reduce"):
            items.append(item("communication functions", part, found[part]["numbers"] + found[part]["communication"]))
        for part in ("column", "row"):
            f = found[part]
            items.append(item("layers", part, f["holds"] + f["numbers"] + f["communication"]))
        items.append(item("MLP numbers", "mlp", found["mlp"]["numbers"]))
        items.append(item("MLP communication", "mlp", found["mlp"]["holds"] + found["mlp"]["communication"]))
    return items
