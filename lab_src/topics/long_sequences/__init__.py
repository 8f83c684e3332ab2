"""Long sequences: what a block keeps for its backward, and what recomputing it costs (q23); later, sequence
parallelism on q18's tensor-parallel block and recomputation in q12's 1F1B memory lane (README.md: the plan).

    records.py   what the kind and the judge share, torch-free: the modes, the block's closed forms (bytes kept, FLOPs),
                 the graded prediction, the record the rank fills
    measure.py   the lab's own measurements around the answer's module: bytes kept after a forward, matmul FLOPs; the
                 case's block and inputs, and the micro-batch sequence run by the rank and by the judge alike
    kind.py      rank side: each mode of the case, the answer's module built on a fresh lab block and measured
    judge.py     parent side: gradients against the plain block's (computed here), bytes kept against the mode's
                 closed form, recomputed FLOPs against the mode's
    figure.py    the picture: bytes kept per mode, measured beside predicted and the closed form
"""
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="long_sequences",
    title="Long sequences: activation memory, recomputation, sequence and context parallelism",
    exercises=("q23",),
    kinds={"recompute": Kind("kind", record="records:RecomputeObserved", settings="records:RecomputeSettings",
                             calls=("recompute_block",),
                             what="q23's recompute_block on one rank, each mode in turn on a fresh lab block (dropout "
                                  "on): the bytes its forward leaves alive, its matmul FLOPs, and its outputs and "
                                  "gradients over micro-batches in flight at once")},
)
