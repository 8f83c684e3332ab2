"""What q26's kind (kind.py) and judge (judge.py) share, torch-free: a case's settings, the unit roundoffs the
tolerances are derived from, GradScaler's rules, the graded prediction, and the record each rank fills.

A case: `blocks` of the lab's transformer blocks (pipeline/model.py, the case's hidden size and heads), each wrapped
by the answer's `mixed_precision_layer(block, dp, compute_dtype)` on every rank of a data-parallel group of the
case's ranks; each step every replica runs its own `batch` sequences (seq_len tokens) through the blocks and a mean
squared error against a target (float32), backward (fp16: the loss scaled by the answer's LossScaler), then the
lab's SGD on the float32 shards (fp16: through the scaler, which may skip). In an fp16 case the lab may put an inf
into one rank's shard gradient at one step (`inject_step`, `inject_rank`), after the reduce-scatter: only that
rank sees it.
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings

ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}
# unit roundoff u = 2^-p of round-to-nearest with p bits of significand (the implicit bit counted): float32 24,
# bfloat16 8, float16 11. 1 + x rounds back to 1 for |x| <= u (ties to even), so an update smaller than u |p| is lost
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# torch.amp.GradScaler's defaults
INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0 ** 16, 2.0, 0.5, 2000
PARTS = ("gradients", "training", "bytes", "dtypes", "scaling")
WHAT = {"gradients": "each step's gradient in the shards and the update, against one process's step from the same "
                     "float32 masters (same casts; the float32 sum's rounding allowed)",
        "training": "the parameters after every step against one process's float32-master training from the start "
                    "(same casts; the compute dtype's rounding allowed)",
        "bytes": "each gather's bytes (the compute dtype's: half of float32's) and each reduce-scatter's (float32)",
        "dtypes": "the shard (the master copy) and its gradient in float32",
        "scaling": "fp16: the loss scale after each step (GradScaler's rules), a step with an inf skipped on every "
                   "rank"}


@dataclass(frozen=True)
class MixedSettings(Settings):
    dtype: str = "bfloat16"          # the compute dtype: "bfloat16" or "float16" (float16 with the answer's LossScaler)
    blocks: int = 2
    batch: int = 2                   # sequences per replica and step
    steps: int = 4
    lr: float = 0.05                 # SGD on the float32 shards
    growth_interval: int = GROWTH_INTERVAL
    inject_step: int = -1            # the step whose gradient gets an inf on one rank (-1: none)
    inject_rank: int = 0             # that rank (its position in the dp group)

    def __post_init__(self):
        if self.dtype not in ("bfloat16", "float16"):
            raise ValueError(f"a q26 case computes in bfloat16 or float16, not {self.dtype}")

    def degrees(self, case) -> dict[str, int]:
        return {"dp": case.stages}

    @property
    def scaled(self) -> bool:
        return self.dtype == "float16"


def shard_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of shard i of a flat vector of `total` elements cut in n as torch.tensor_split does (the first
    total % n shards one element longer): q22's layout (topics/sharding/records.py has the same; a topic imports no
    other topic's modules beyond two floors, tests/test_topics.py)."""
    base, extra = divmod(total, n)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def scale_trajectory(found: list[bool], growth_interval: int, init: float = INIT_SCALE) -> list[float]:
    """GradScaler's scale after each step's update(), given whether each step found an inf or NaN: x0.5 on one (and
    the run of clean steps starts again), x2 after `growth_interval` clean steps in a row."""
    scale, clean, out = init, 0, []
    for inf in found:
        if inf:
            scale, clean = scale * BACKOFF_FACTOR, 0
        else:
            clean += 1
            if clean == growth_interval:
                scale, clean = scale * GROWTH_FACTOR, 0
        out.append(scale)
    return out


# the graded prediction: the lab's default block (hidden 32: 12,704 parameters), computed in bfloat16; a stage of 8
# such blocks sharded over 4 ranks
PREDICTION_NAME = "predicted_mixed_bytes"
PREDICTION_KEYS = ("gather", "master", "bf16_only")
BLOCK_PARAMS = 12_704
PREDICTION_BLOCKS, PREDICTION_RANKS = 8, 4


def prediction_wanted() -> dict[str, float]:
    """"gather": the bytes of one block's gathered weights in bfloat16; "master": the bytes of a rank's float32
    shards of the 8 blocks (the master copy); "bf16_only": the same shards kept in bfloat16 alone."""
    shard = PREDICTION_BLOCKS * BLOCK_PARAMS / PREDICTION_RANKS
    return {"gather": BLOCK_PARAMS * ITEMSIZE["bfloat16"], "master": shard * ITEMSIZE["float32"],
            "bf16_only": shard * ITEMSIZE["bfloat16"]}


class MixedObserved(Observed):
    layers_flat: dict           # block name -> [its flat length, this rank's shard length]
    position: int               # this rank's position in the dp group
    steps: list                 # per step: "before", "after" (this rank's shards, float32 copies, one per block),
                                # "grad" (the shards' .grad after the backward, before the scaler: float32 copies, None
                                # where there was none), "shard_dtype", "grad_dtype" (as the answer left them),
                                # "scale" (the scaler's get_scale() after update(); None in bf16), "gathers" [[layer,
                                # bytes, elements]], "scatters" [[bytes, elements]], "reduces" [[bytes, elements]]
                                # (the answer's dp.all_reduce), "loss" (this replica's, float32)
    out_dtype: str              # the dtype the first block's module returned
    part: str                   # where the case was when the answer raised
