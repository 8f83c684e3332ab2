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


@dataclass(frozen=True)
class RecomputeStepSettings(Settings):
    """q23's study in the pipeline (checks/recompute_study.py): every block of each rank's stage wrapped by the
    answer's recompute_block(block, mode), then the case's pipelined step (q12's 1F1B)."""
    mode: str = "none"

    def degrees(self, case) -> dict[str, int]:
        return {"pp": case.stages}


# ---------------------------------------------------------------------------------------------------------------------
# q24: attention over a sequence split across ranks (ring attention, contiguous and zigzag, and Ulysses beside it)
#
# Shapes: q, k and v are (b, H, S, D) as torch's scaled_dot_product_attention takes them; a rank holds the rows of its
# shard. The sequence is cut into C chunks of equal length, C = N (contiguous: rank r holds chunk r) or 2N (zigzag:
# rank r holds chunks r and 2N - 1 - r, in that order); Ulysses cuts it into P contiguous shards. When S is no multiple
# of C the lab pads the sequence at its END with zero rows up to the next multiple (`padded`), hands the ranks the
# padded shards and judges the real rows only (the padded rows' output gradient is zero). A causal query never sees a
# later key, so no real query sees a padded one and an answer needs no special case: every shard has S_p / N rows.
# (Non-causal attention is asked on whole shards only: there a padded key would be seen.)
#
# Bytes one rank sends (e bytes an element, S_p the padded length), from the messages the lab recorded:
#   ring forward     2 (N - 1) (S_p/N) b H D e       K and V, each sent on N - 1 times
#   ring backward    (4N - 2) (S_p/N) b H D e        K and V again (N - 1 each), and dK, dV round all N ranks home
#   Ulysses forward  4 (S_p/P) b H D e (P - 1)/P     q, k, v to head shards and the output back: four all-to-alls,
#                                                   each keeping 1/P of its input on the rank
#   Ulysses backward the same four, reversed
# Work: matmul FLOPs the rank's forward counted (torch.utils.flop_counter's formulas, 2 per multiply-add), in tiles
# of one chunk of queries against one chunk of keys, c = S_p/C rows each: QK^T and PV, 4 b H c^2 D FLOPs a tile.
#   contiguous, causal   rank r computes r full tiles and its diagonal one: r + 1 tiles; the busiest over the mean
#                        is N / ((N + 1)/2) = 2N/(N + 1) (1.33, 1.60, 1.78 at N = 2, 4, 8)
#   zigzag, causal       its own block whole (2c x 2c: 4 tiles) and half of every other (2 tiles): 2N + 2 on every
#                        rank, 1.00
#   not causal           every tile: N (contiguous) or 4N (zigzag) tiles
# Counted per visible score instead (the diagonal tile's half), contiguous would be (2N - 1)/N: the lab counts what the
# rank computed, and a matmul computes its whole tile.
# ---------------------------------------------------------------------------------------------------------------------

ATTENTION_FUNCTIONS = ("ring", "ulysses")
LAYOUTS = ("contiguous", "zigzag")
ULYSSES_FUNCTION = "ulysses_attention"     # the answer cell's second function, beside ring_attention


@dataclass(frozen=True)
class AttentionSettings(Settings):
    runs: list                          # per run, in order: {"fn": "ring" | "ulysses", "layout", "causal", "seq",
                                        #   "heads", "dim"} (Ulysses: contiguous shards); a run of Ulysses whose heads
                                        #   do not divide over the ranks must raise ValueError naming both
    batch: int = 1
    dtype: str = "float64"
    perturb: bool = False               # every input changed by noise from a seed drawn outside the answer

    def degrees(self, case) -> dict[str, int]:
        return {"cp": case.stages}


def chunk_count(n: int, layout: str) -> int:
    return 2 * n if layout == "zigzag" else n


def padded(seq: int, n: int, layout: str) -> int:
    """The sequence length the ranks hold together: S rounded up to a multiple of the chunks."""
    c = chunk_count(n, layout)
    return -(-seq // c) * c


def positions(rank: int, n: int, rows: int, layout: str) -> list[int]:
    """The global positions of the `rows` rows rank `rank` of n holds, in the order it holds them."""
    if layout == "zigzag":                   # chunks rank and 2n - 1 - rank of 2n
        c = rows // 2
        return list(range(rank * c, (rank + 1) * c)) + list(range((2 * n - 1 - rank) * c, (2 * n - rank) * c))
    return list(range(rank * rows, (rank + 1) * rows))


def expects_error(run: dict, n: int) -> bool:
    """A Ulysses run whose heads cannot be dealt out whole to the ranks."""
    return run["fn"] == "ulysses" and (n > run["heads"] or run["heads"] % n != 0)


def shard_elements(run: dict, n: int, batch: int = 1) -> int:
    """Elements of one rank's shard of q (or k, v): (S_p/N) b H D."""
    layout = run.get("layout", "contiguous") if run["fn"] == "ring" else "contiguous"
    return padded(run["seq"], n, layout) // n * batch * run["heads"] * run["dim"]


def ring_forward_bytes(run: dict, n: int, element: int, batch: int = 1) -> int:
    return 2 * (n - 1) * shard_elements(run, n, batch) * element


def ring_backward_bytes(run: dict, n: int, element: int, batch: int = 1) -> int:
    return (4 * n - 2) * shard_elements(run, n, batch) * element if n > 1 else 0


def ulysses_bytes(run: dict, n: int, element: int, batch: int = 1) -> float:
    """Bytes one rank sends in Ulysses' forward (and again in its backward): four all-to-alls of its shard."""
    return 4 * shard_elements(run, n, batch) * element * (n - 1) / n


def tiles(rank: int, n: int, layout: str, causal: bool) -> int:
    """Chunk-by-chunk tiles rank `rank` computes in the forward, skipping those with no visible key."""
    if not causal:
        return n if layout == "contiguous" else 4 * n
    return rank + 1 if layout == "contiguous" else 2 * n + 2


def tile_flops(run: dict, n: int, batch: int = 1) -> int:
    """Matmul FLOPs of one tile's forward: QK^T and PV, 2 c^2 D each per (batch, head), c = S_p/C."""
    c = padded(run["seq"], n, run["layout"]) // chunk_count(n, run["layout"])
    return 4 * batch * run["heads"] * c * c * run["dim"]


def balance(n: int, layout: str, causal: bool) -> float:
    """The busiest rank's forward work over the mean, as `tiles` counts it."""
    work = [tiles(r, n, layout, causal) for r in range(n)]
    return max(work) * n / sum(work)


# how much more a rank's backward may compute than its forward's tiles: a flash-style backward recomputes the scores
# and makes four products more (5 matmuls a tile against the forward's 2); recomputing the block under autograd, 6
WORK_SLACK = 0.01
BACKWARD_FACTOR = 3.0

# the graded prediction: one sequence of S = 4096 tokens, 32 heads of 128, bfloat16, N = P = 8 ranks
PREDICTION_Q24 = "predicted_traffic_and_balance"
PREDICTION_Q24_KEYS = ("ring", "ulysses", "contiguous", "zigzag")
PREDICTION_Q24_SHAPE = {"seq": 4096, "heads": 32, "dim": 128, "ranks": 8, "element": 2}


def prediction_q24_wanted() -> dict[str, float]:
    p = PREDICTION_Q24_SHAPE
    run = {"fn": "ring", "layout": "contiguous", "seq": p["seq"], "heads": p["heads"], "dim": p["dim"]}
    return {"ring": ring_forward_bytes(run, p["ranks"], p["element"]),
            "ulysses": ulysses_bytes(run, p["ranks"], p["element"]),
            "contiguous": balance(p["ranks"], "contiguous", True), "zigzag": balance(p["ranks"], "zigzag", True)}


class AttentionObserved(Observed):
    perturbed: int              # (rank 0) the seed of the change the lab made to every input
    runs: list                  # per run of the settings, in order: {"raised": {"type", "message", "line"} if the
                                #   call raised, "returned": what was wrong with what it returned ("" if nothing),
                                #   "out", "dq", "dk", "dv": this rank's shard (tensors; a gradient None if none
                                #   reached the input), "forward" / "backward": {"sends": [[peer, bytes, t0, t1]],
                                #   "recvs": [[peer, bytes, t0, t1]], "collectives": [[kind, bytes, t0, t1]],
                                #   "matmuls": [[t0, t1, flops]], "span": [t0, t1]}}


# ---------------------------------------------------------------------------------------------------------------------
# q23's third answer: sequence parallelism on the tensor-parallel block (Korthikanti et al. 2022, Megatron-style)
#
# `sp_block(block, tp)` (the answer cell's second function, beside recompute_block): rank r of t holds the positions
# [r s/t, (r + 1) s/t) of every sequence; its LayerNorms and residual dropouts run on them, an all-gather along the
# sequence comes before each column-parallel layer (qkv, up) and a reduce-scatter along it after each row-parallel one
# (proj, down). What a rank keeps for the backward (the lab's count, autograd's saved tensors, each storage once, the
# parameters left out), dropout on:
#
#   plain block (one process)   e (18 sbh + 3 a s^2 b + 4 sb) + s^2                    (q23's "none" above)
#   t-way tensor parallel       e (6 sbh + 12 sbh/t + 3 a s^2 b/t + 4 sb) + s^2        (q18: the LayerNorms' inputs
#                               and outputs, the residual masks, whole on every rank; measured on q18's reference
#                               block, tests/test_q23_recompute_block.py: the kind does not run another exercise's
#                               answer)
#   sequence parallel           e (18 sbh + 3 a s^2 b + 4 sb) / t + s^2                 (every term split, the causal
#                               mask aside: measured on every rank, tests/test_q23_recompute_block.py)
#
# The paper's forms (1-byte masks, no LayerNorm statistics, no causal mask): sbh (10 + 24/t + 5 as/(ht)) and
# sbh/t (34 + 5 as/h). A column-parallel layer that keeps its gathered input (what autograd does for F.linear on the
# all-gather's output) keeps e sbh (1 - 1/t) more, twice a block (qkv and up).
#
# Collectives per rank and block, from the lab's record (an all-gather is recorded with the piece the rank hands it,
# a reduce-scatter with the whole buffer it scatters): forward 2 all-gathers of e sbh/t and 2 reduce-scatters of
# e sbh; backward 2 reduce-scatters of e sbh (the column layers' input gradients) and 4 all-gathers of e sbh/t (the
# row layers' output gradients, and the column layers' inputs gathered again: 2 if they kept the gathered input),
# and all-reduces of the replicated parameters' gradients (the LayerNorms' weights and biases, proj's and down's
# biases: 6 h elements), where tensor parallelism all-reduces e sbh twice each way.
# ---------------------------------------------------------------------------------------------------------------------

SP_FUNCTION = "sp_block"
SP_PARTS = ("block", "dropout")         # dropout off, then on (SP_DROPOUT)
SP_DROPOUT = 0.2
# the parameters a sequence-parallel rank holds whole and uses on its shard: their gradients summed over the group
SP_REPLICATED = ("attn_norm.weight", "attn_norm.bias", "mlp_norm.weight", "mlp_norm.bias", "proj.bias", "down.bias")
SP_HELD = ("attn_norm", "qkv", "proj", "mlp_norm", "up", "down")


@dataclass(frozen=True)
class SPSettings(Settings):
    parts: tuple = SP_PARTS
    dtype: str = ""                     # "" the configuration's (float64 in grading); "bfloat16" for the memory case
    batch: int = 0                      # 0: the configuration's micro-batch
    values: bool = True                 # judge the numbers (not in a bfloat16 case: only its bytes and traffic)

    def degrees(self, case) -> dict[str, int]:
        return {"tp": case.stages}


def tp_kept_bytes(b: int, s: int, h: int, a: int, itemsize: int, t: int) -> int:
    """What one rank of the t-way tensor-parallel block keeps (the module docstring)."""
    return itemsize * (6 * s * b * h + 12 * s * b * h // t + 3 * a * s * s * b // t + 4 * s * b) + s * s


def sp_kept_bytes(b: int, s: int, h: int, a: int, itemsize: int, t: int) -> int:
    """What one rank of the t-way sequence-parallel block keeps (measured: the module docstring)."""
    return itemsize * (18 * s * b * h + 3 * a * s * s * b + 4 * s * b) // t + s * s


def sp_paper_bytes(b: int, s: int, h: int, a: int, t: int) -> int:
    return (34 * s * b * h + 5 * a * s * s * b) // t


def sp_gathered_extra(b: int, s: int, h: int, itemsize: int, t: int) -> int:
    """What keeping the gathered input in both column-parallel layers adds."""
    return 2 * itemsize * s * b * h * (t - 1) // t


def sp_traffic(b: int, s: int, h: int, itemsize: int, t: int) -> dict:
    """Per rank and block: {direction: {kind: [bytes of each call]}} (the module docstring); the backward's all-gathers
    are 4, or 2 where the column layers kept their gathered input (the memory part names that)."""
    piece, whole = itemsize * b * s * h // t, itemsize * b * s * h
    return {"forward": {"all_gather": [piece] * 2, "reduce_scatter": [whole] * 2},
            "backward": {"all_gather": [piece] * 4, "reduce_scatter": [whole] * 2}}


SP_NORM_BYTES = 6                       # x h x itemsize: the replicated gradients' all-reduces, at most

# the graded prediction: what one rank keeps at q23's prediction shape on t = 4 ranks, bfloat16, dropout on
SP_PREDICTION_NAME = "predicted_sp_saved_bytes"
SP_PREDICTION_KEYS = ("tensor_parallel", "sequence_parallel")
SP_PREDICTION_T = 4


def sp_prediction_wanted() -> dict[str, float]:
    p, e, t = PREDICTION_SHAPE, ITEMSIZE[PREDICTION_DTYPE], SP_PREDICTION_T
    return {"tensor_parallel": tp_kept_bytes(p["b"], p["s"], p["h"], p["a"], e, t),
            "sequence_parallel": sp_kept_bytes(p["b"], p["s"], p["h"], p["a"], e, t)}


class SPObserved(Observed):
    parts: dict                 # part ("block", "dropout") -> {"raised": {"type", "message", "line"} if it raised,
                                #   "returned": what was wrong with what sp_block returned ("" if nothing), "shape":
                                #   [b, s, h, a, itemsize, t], "out", "in_grad": this rank's shard, "grads": {name:
                                #   tensor or None} (SP_HELD's weight and bias), "shapes": {name: [..]}, "saved":
                                #   {"bytes", "storages", "largest"}, "forward" / "backward": [[kind, bytes, group]]}


@dataclass(frozen=True)
class SPTrainSettings(Settings):
    """The digits model trained with the answer's sp_block on t ranks (kind_sp_train.py)."""
    steps: int = 20
    lr: float = 1e-2
    perturb: bool = False               # the embedding changed once built, by an amount drawn outside the ranks

    def degrees(self, case) -> dict[str, int]:
        return {"tp": case.stages}


class SPTrainObserved(Observed):
    losses: list                # the loss after each step (every rank computes it)
    norms: dict                 # the replicated parameters (LayerNorms, row layers' biases) after training
    perturbed: int              # (rank 0) the seed of the lab's change to the embedding (pipeline/perturb.py)
