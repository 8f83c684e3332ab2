"""Long sequences: what a block keeps for its backward, and what recomputing it costs (q23), with a study of the
modes in q12's 1F1B memory lane (kind_step.py, checks/recompute_study.py); later, sequence parallelism on q18's
tensor-parallel block (README.md: the plan).

    records.py   what the kind and the judge share, torch-free: the modes, the block's closed forms (bytes kept, FLOPs),
                 the graded prediction, the record the rank fills
    measure.py   the lab's own measurements around the answer's module: bytes kept after a forward, matmul FLOPs; the
                 case's block and inputs, and the micro-batch sequence run by the rank and by the judge alike
    kind.py      rank side: each mode of the case, the answer's module built on a fresh lab block and measured
    kind_step.py rank side of the study in the pipeline: each stage's blocks wrapped in a mode, q12's 1F1B step run
    judge.py     parent side: gradients against the plain block's (computed here), bytes kept against the mode's
                 closed form, recomputed FLOPs against the mode's
    figure.py    the picture: bytes kept per mode, measured beside predicted and the closed form

q23's third answer, sequence parallelism on the tensor-parallel block (the answer cell's `sp_block(block, tp)`):
    records.py   (its middle part) the closed forms per rank (tensor and sequence parallel), the collectives, the
                 prediction, the record
    kind_sp.py   rank side: the answer's block on its sequence shard, dropout off and on; saved bytes, collectives
    kind_sp_train.py  rank side: the digits model trained with the answer's blocks on t ranks
    judge_sp.py  parent side: values against one process's block, the replicated parameters' gradients summed,
                 the saved bytes against the closed form, the all-gathers and reduce-scatters; the training's
                 curve against one process's
    figure.py    (sp_bars) the bytes each rank kept, beside the plain, tensor- and sequence-parallel closed forms

q24, attention over a sequence split across ranks (ring attention, contiguous and zigzag; Ulysses beside it):
    records.py          (its second half) the layouts, the padding, the bytes and work formulas, the prediction
    attention.py        the runs' tensors, the shards of each layout, one process's answer, the lab's matmul count
    kind_attention.py   rank side: each run of the case, the answer's ring or Ulysses, forward and backward
    judge_attention.py  parent side: values against torch's SDPA, messages and bytes, the work each rank computed
    figure_attention.py the pictures: the tiles each rank computes at each step of the ring, per layout; a run's
                        blocks over time per rank, with each rank's work
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import LAYOUT, Kind, Topic

TOPIC = Topic(
    name="long_sequences",
    title="Long sequences: activation memory, recomputation, sequence and context parallelism",
    exercises=("q23", "q24"),
    kinds={"recompute": Kind("kind", record="records:RecomputeObserved", settings="records:RecomputeSettings",
                             calls=("recompute_block",),
                             what="q23's recompute_block on one rank, each mode in turn on a fresh lab block (dropout "
                                  "on): the bytes its forward leaves alive, its matmul FLOPs, and its outputs and "
                                  "gradients over micro-batches in flight at once"),
           "recompute_step": Kind("kind_step", record="lab_src.harness.observed:StepObserved",
                                  settings="records:RecomputeStepSettings", step=True,
                                  calls=LAYOUT + ("needs_dataloader", "recompute_block"),
                                  what="q23's study: every block of each rank's stage wrapped by the answer's "
                                       "recompute_block in the case's mode, then the case's pipelined step (q12's "
                                       "1F1B), its saved bytes on every event (the memory lane)"),
           "sp_block": Kind("kind_sp", record="records:SPObserved", settings="records:SPSettings",
                            calls=("recompute_block",), timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                            what="q23's sp_block (the answer cell's second function) on the case's t ranks, dropout "
                                 "off and on: each rank's sequence shard of the output and of the gradients, what "
                                 "its forward saved for the backward, its all-gathers and reduce-scatters"),
           "sp_train": Kind("kind_sp_train", record="records:SPTrainObserved", settings="records:SPTrainSettings",
                            calls=("recompute_block",), timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                            what="the digits model trained with q23's sp_block on the case's t ranks (embedding and "
                                 "head replicated, the blocks on each rank's positions): each rank's loss curve"),
           "attention": Kind("kind_attention", wire=True, record="records:AttentionObserved",
                             settings="records:AttentionSettings",
                             calls=("ring_attention",), timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                             view="figure_attention:attention_view",
                             what="q24's ring_attention (contiguous and zigzag shards, causal or not) and the answer "
                                  "cell's ulysses_attention on the case's ranks, run after run: each rank's rows of "
                                  "the output and gradients, its messages and collectives, and every matmul it ran"),
           },
)
