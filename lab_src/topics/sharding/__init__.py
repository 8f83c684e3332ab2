"""Sharding the training state: AdamW's state and the gradients sharded over the data-parallel ranks (q21, ZeRO-1
and ZeRO-2), on the student's own ring halves; then the parameters too, layer by layer inside a pipeline stage
(q22, FSDP).

    records.py   what the kind and the judge share, torch-free: the shards of a flat vector, the record
    kind.py      rank side: a grid's steps (the reference 1F1B in grading), then the answer's sharded AdamW step
    judge.py     parent side: parameters against one process's AdamW, the state and gradients held, the messages
    figure.py    the opening pictures: what each rank holds under the ZeRO stages; FSDP's gather and free rhythm
    fsdp.py      rank side of q22: the gathers and reduce-scatters a layer is given, every gathered copy watched
    kind_fsdp.py rank side of q22: each block of a grid's stages wrapped by the answer, steps of 1F1B and SGD
    judge_fsdp.py parent side of q22: gradients against one process's, bytes at rest and at the peak, the counts
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import LAYOUT, EventKind, Kind, Topic

TOPIC = Topic(
    name="sharding",
    title="Sharding the training state: the optimizer and the gradients over the data-parallel ranks (ZeRO)",
    exercises=("q21", "q22"),
    kinds={
        "zero": Kind("kind", wire=True, record="records:ZeroObserved", settings="records:ZeroSettings",
                     calls=LAYOUT + ("p2p_communicate", "one_f_one_b_step", "sharded_adamw_step"),
                     timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                     what="q21's sharded AdamW step on a data x pipeline grid of the case's ranks, after each "
                          "replica's 1F1B step, a few steps in a row: parameters, the state and gradients each "
                          "rank holds, every message"),
        "fsdp": Kind("kind_fsdp", wire=True, record="records:FsdpObserved", settings="records:FsdpSettings",
                     calls=LAYOUT + ("p2p_communicate", "one_f_one_b_step", "ring_all_reduce", "fsdp_layer"),
                     timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                     what="q22's fsdp_layer wrapping every block of a data x pipeline grid's stages, a few 1F1B and "
                          "SGD steps: the whole gradients, the bytes held at rest and at the peak, every gather and "
                          "reduce-scatter"),
    },
    # q22's gathers and reduce-scatters (fsdp.py): they run inside a forward or a backward, so the timeline draws
    # them in a thin row under the rank's own
    events=(EventKind("allgather_fsdp", "FSDP all-gather of a layer's weights", "#72b7b2", lane_label="FSDP"),
            EventKind("reducescatter_fsdp", "FSDP reduce-scatter of a layer's gradient", "#b279a2",
                      lane_label="FSDP")),
)
