"""Mixed precision in the sharded step (q26): q22's FSDP layer with float32 master shards, gathers and compute in
bfloat16 or float16, gradients reduced in float32, and an fp16 loss scaler whose skip is agreed over the group.

    records.py   what the kind and the judge share, torch-free: settings, unit roundoffs, GradScaler's rules, the
                 graded prediction, the record each rank fills
    model.py     the case's blocks, batches and loss; one process's step with the same casts (the judge's)
    group.py     MixedGroup: q22's FsdpGroup whose gather takes a cast of the shard, and an all-reduce
    kind.py      rank side: every block wrapped by the answer, SGD steps (fp16 through the answer's LossScaler), the
                 lab's inf on one rank's gradient; shards, gradients, dtypes, scale and bytes recorded
    judge.py     parent side: gradients and updates against one process, the training, bytes, dtypes, the scale
    figure.py    the opening picture: which tensor is in which dtype in one block's step
"""
from lab_src.harness.limits import COLLECTIVE_TIMEOUT_FACTOR
from lab_src.topics import Kind, Topic

TOPIC = Topic(
    name="mixed_precision",
    title="Mixed precision in the sharded step: float32 master shards, bf16 gathers, fp16 loss scaling",
    exercises=("q26",),
    kinds={"mixed_precision": Kind(
        "kind", wire=True, record="records:MixedObserved", settings="records:MixedSettings",
        calls=("ring_all_reduce", "mixed_precision_layer"), timeout_factor=COLLECTIVE_TIMEOUT_FACTOR,
        view="figure:mixed_view",
        what="q26's mixed_precision_layer wrapping every block on a data-parallel group of the case's ranks, SGD "
             "steps on the float32 shards (fp16 through the answer's LossScaler, an inf injected on one rank): "
             "shards, gradients, dtypes, the scale, the bytes of every gather and reduce-scatter")},
)
