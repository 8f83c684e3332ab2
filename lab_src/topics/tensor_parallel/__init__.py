"""Tensor parallelism: column- and row-parallel layers, the MLP with one all-reduce (q17); the whole block,
dropout seeds, training to one process's curve, tensor parallel inside pipeline stages (q18).

    runtime.py       what one rank of a tensor-parallel group is given (`tp.rank`, `tp.size`, `tp.group`)
    records.py       what the kinds and the judges share, torch-free (the parts a case tries)
    kind_layers.py   rank side (q17): the two communication functions, the layers, the MLP
    kind_block.py    rank side (q18): the block, dropout off and on, the replicated LayerNorms
    kind_train.py    rank side (q18): the digits model trained on t ranks, or t x p
    judge_layers.py  parent side (q17); judge_block.py, judge_train.py (q18)
    traffic.py       what a training step moves, tensor against pipeline parallel
    figure.py, block_figure.py, timeline.py, curves.py   the pictures
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="tensor_parallel",
    title="Tensor parallelism: layers, the whole block, dropout seeds, training",
    exercises=("q17", "q18"),
    kinds={
        "tp": Kind("kind_layers", record="records:LayersObserved", calls=("tp_layers",),
                   timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                   what="q17's tensor-parallel pieces on the case's t ranks: the two communication functions, the "
                        "column- and row-parallel layers, the MLP; outputs, gradients, shards and collectives"),
        "tp_block": Kind("kind_block", record="records:BlockObserved", settings="records:BlockSettings",
                         calls=("tp_layers", "tp_block"),
                         timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                         what="q18's tensor-parallel block on the case's t ranks, dropout off and on: outputs, "
                              "gradients, shards, collectives, the replicated LayerNorms after an optimizer step"),
        "tp_train": Kind("kind_train", record="records:TrainObserved", settings="records:TrainSettings",
                         calls=("tp_layers", "tp_block"),
                         timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                         what="the digits model with q18's tensor-parallel blocks, trained on t ranks (or t x p: "
                              "tensor parallel inside pipeline stages); each rank's loss curve"),
    },
)
