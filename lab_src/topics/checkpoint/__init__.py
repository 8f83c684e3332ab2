"""A checkpoint of the sharded training state that loads on another number of ranks (q27): q21's sharded AdamW state
saved by every rank's own shard, loaded on m ranks by slices of the old shards.

    records.py   what its kind and judge share, torch-free: settings, shards and their overlaps, the allowances,
                 the graded prediction, the record each rank fills
    kind.py      rank side: q21's steps on n ranks, the answer's save, the lab's handover in memory, the answer's load
                 on m ranks, the next step from each; bytes written and read counted by the process's I/O counters
    judge.py     parent side: the folder measured, the reads, the loaded state bitwise, the next step
    figure.py    the pictures: the old shards against the new, the slices each new rank reads
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="checkpoint",
    title="A checkpoint of the sharded training state that loads on another number of ranks",
    exercises=("q27",),
    kinds={"checkpoint": Kind("kind", wire=True, record="records:CheckpointObserved",
                              settings="records:CheckpointSettings",
                              calls=("sharded_adamw_step", "load_sharded"), timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
                              what="q27's save_sharded on n ranks after q21's steps, then its load_sharded on m ranks "
                                   "and the next step: the folder, the bytes each rank wrote and read, the state "
                                   "loaded, the next step's loss and parameters")},
)
