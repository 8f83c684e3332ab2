"""What q23's kind (kind.py) and judge (judge.py) share, torch-free: the modes, the lab block's closed forms (bytes
kept for the backward and matmul FLOPs, measured on this CPU: tests/test_q23_recompute_block.py holds them to the
block's own measurement), the graded prediction's shape, and the record each rank fills.

The lab's block (pipeline/model.py `Block`, dropout on, training mode) keeps for its backward, with b the batch, s
the sequence, h the hidden size, a the heads and e the bytes of an element (2 in bfloat16, 4 in float32):

    none        e (18 sbh + 3 a s^2 b + 4 sb) + s^2
    selective   e (18 sbh + 4 sb)             the attention core (QK^T, softmax, dropout, PV) recomputed
    full        e sbh                         the block's input only; the whole forward recomputed

18 sbh: the block's input and the attention LayerNorm's output (sbh each), the qkv projection's output (3 sbh, one
storage: q, k and v are views of it), the attention's output (sbh, proj's input), the two residual dropout masks
(sbh each), the MLP LayerNorm's input and output (2 sbh), GELU's input and output (4 sbh each). 3 a s^2 b: the
softmax's output, the attention dropout's mask and the dropped probabilities. 4 sb: the two LayerNorms' mean and
1/std per token. s^2: the causal mask (bool, one byte). In bfloat16 that is sbh (36 + 6 as/h) + 8 sb + s^2 against
the paper's 34 sbh + 5 as^2 b (Korthikanti et al. 2022): the lab's dropout masks are in the activations' dtype (2
bytes, pipeline/dropout.py `keep`), the paper's 1 byte; three masks, so 2 sbh and a s^2 b more. In float32
every term but s^2 doubles.

A recomputation also keeps what restores its random numbers (a generator's state is 5,056 bytes: torch's
checkpoint keeps torch's CPU state, a recompute of the lab's block the states of block.streams), which the
judge's slack covers (`SLACK_BYTES`).

FLOPs (matmuls, as torch.utils.flop_counter counts them, 2 per multiply-add): the forward F = 24 bsh^2 + 4 bs^2 h
(the four linear layers, then QK^T and PV), the backward 2F. Full recomputation adds one forward: +F, a third of
the plain 3F. Selective adds the core's matmuls: at most 4 bs^2 h, and 2 bs^2 h with torch.utils.checkpoint's
non-reentrant recomputation, which stops once it has remade what the backward needs (PV's output is not).
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings

MODES = ("none", "selective", "full")
ITEMSIZE = {"float32": 4, "bfloat16": 2, "float64": 8}
# what a measured figure may exceed a mode's closed form by: the states a recomputation keeps to replay its random
# numbers (5,056 B a generator: torch's CPU state and the lab block's two streams), and a per cent
SLACK_BYTES = 16 * 1024
SLACK = 0.01


@dataclass(frozen=True)
class RecomputeSettings(Settings):
    batch: int = 2                      # b (the configuration gives s, h, a, the dropout and the seed)
    dtype: str = "float32"              # the block's and the input's dtype: "float32" or "bfloat16"
    modes: tuple = MODES

    def degrees(self, case) -> dict[str, int]:
        return {"pp": case.stages}      # one rank: nothing is distributed


def kept_bytes(b: int, s: int, h: int, a: int, itemsize: int, mode: str) -> int:
    """Bytes the lab's block keeps for its backward under `mode`, dropout on (the module docstring)."""
    if mode == "none":
        return itemsize * (18 * s * b * h + 3 * a * s * s * b + 4 * s * b) + s * s
    if mode == "selective":
        return itemsize * (18 * s * b * h + 4 * s * b)
    if mode == "full":
        return itemsize * s * b * h
    raise ValueError(f"no mode {mode!r}: {', '.join(MODES)}")


def paper_bytes(b: int, s: int, h: int, a: int, mode: str) -> int:
    """The paper's figures (16-bit activations, 1-byte masks): 34 sbh + 5 as^2 b, 34 sbh, 2 sbh."""
    return {"none": 34 * s * b * h + 5 * a * s * s * b, "selective": 34 * s * b * h, "full": 2 * s * b * h}[mode]


def forward_flops(b: int, s: int, h: int) -> int:
    """Matmul FLOPs of the block's forward: the four linear layers and the attention's two products."""
    return 24 * b * s * h * h + 4 * b * s * s * h


def core_flops(b: int, s: int, h: int) -> int:
    """Matmul FLOPs of the attention core's forward (QK^T and PV): the most a selective recomputation adds."""
    return 4 * b * s * s * h


def extra_flops_range(b: int, s: int, h: int, mode: str) -> tuple[float, float]:
    """The FLOPs a mode's backward may add to the plain block's (forward F, backward 2F), (low, high)."""
    f = forward_flops(b, s, h)
    if mode == "none":
        return 0.0, SLACK * f
    if mode == "selective":
        return 1.0, core_flops(b, s, h) * (1 + SLACK)
    # a recomputation of the whole forward; a hand-written one may skip the last linear layer (8 bsh^2)
    return f - 8 * b * s * h * h, f * (1 + SLACK)


# the graded prediction: bytes kept per mode for this shape, in bfloat16, dropout on
PREDICTION_NAME = "predicted_saved_bytes"
PREDICTION_KEYS = MODES
PREDICTION_SHAPE = {"b": 4, "s": 256, "h": 64, "a": 8}
PREDICTION_DTYPE = "bfloat16"


def prediction_wanted() -> dict[str, float]:
    p = PREDICTION_SHAPE
    return {m: kept_bytes(p["b"], p["s"], p["h"], p["a"], ITEMSIZE[PREDICTION_DTYPE], m) for m in MODES}


def shape_of(cfg, settings) -> tuple[int, int, int, int]:
    """(b, s, h, a) of a case."""
    return settings.batch, cfg.seq_len, cfg.hidden_size, cfg.num_heads


class RecomputeObserved(Observed):
    modes: dict                 # mode -> {"returned": what was wrong with what recompute_block returned ("" if
                                #   nothing), "kept": {"bytes" (every storage the forward left alive and the input,
                                #   measure.py `kept`), "saved" (what autograd saved), "storages", "largest"},
                                #   "flops": {"forward", "backward", "forward_s", "backward_s"}, "run": {"outputs":
                                #   [3 tensors], "input_grads": [3], "grads": {name: tensor}} (forward A, forward B,
                                #   backward B, backward A, forward and backward C), "raised": {"type", "message",
                                #   "line", "part"} when a part raised}
    plain: dict                 # the lab's own block on the rank, measured and run alike: {"kept", "flops", "run"}
