"""Sharding the training state: AdamW's state and the gradients sharded over the data-parallel ranks (q21, ZeRO-1
and ZeRO-2), on the student's own ring halves.

    records.py   what the kind and the judge share, torch-free: the shards of a flat vector, the record
    kind.py      rank side: a grid's steps (the reference 1F1B in grading), then the answer's sharded AdamW step
    judge.py     parent side: parameters against one process's AdamW, the state and gradients held, the messages
    figure.py    the opening picture: what each rank holds of parameters, gradients and optimizer state
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="sharding",
    title="Sharding the training state: the optimizer and the gradients over the data-parallel ranks (ZeRO)",
    exercises=("q21",),
    kinds={
        "zero": Kind("kind", record="records:ZeroObserved",
                     calls=LAYOUT + ("p2p_communicate", "one_f_one_b_step", "sharded_adamw_step"),
                     timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                     what="q21's sharded AdamW step on a data x pipeline grid of the case's ranks, after each "
                          "replica's 1F1B step, a few steps in a row: parameters, the state and gradients each "
                          "rank holds, every message"),
    },
)
