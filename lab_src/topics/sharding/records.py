"""What q21's kind (kind.py) and judge (judge.py) share, torch-free: the shards of a flat vector, the AdamW
hyper-parameters of the contract, the graded prediction's configuration, and the record each rank fills."""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import StageObserved
from lab_src.harness.settings import GridSettings

BETAS, EPS, WEIGHT_DECAY = (0.9, 0.999), 1e-8, 0.01     # torch.optim.AdamW's defaults: the contract's
LR = 0.01


@dataclass(frozen=True)
class ZeroSettings(GridSettings):
    steps: int = 3                      # steps in a row (each a replica's 1F1B step, then the answer's AdamW step)
    lr: float = LR
    betas: tuple = BETAS                # AdamW's settings, passed to the answer as torch.optim.AdamW takes them
    eps: float = EPS
    weight_decay: float = WEIGHT_DECAY

    def adamw(self) -> dict:
        """The keyword arguments the answer gets beside lr (a tuple of betas: the spec carries it as a list)."""
        return {"betas": tuple(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def said(self) -> str:
        """The settings as a sentence names them: 'betas (0.9, 0.999), eps 1e-08, weight_decay 0.01'."""
        b1, b2 = self.betas
        return f"betas ({b1:g}, {b2:g}), eps {self.eps:g}, weight_decay {self.weight_decay:g}"


@dataclass(frozen=True)
class FsdpSettings(GridSettings):
    steps: int = 3
    digits: bool = False                # the digit classifier's stages, trained with AdamW (else SGD on the lab's model)
    lr: float | None = None             # AdamW's, in a training
PREDICTION_NAME = "predicted_bytes"     # a function of q21's answer cell: bytes per rank of each stage
PREDICTION_KEYS = ("dp", "zero1", "zero2", "sent")
PREDICTION_RANKS = 4
PREDICTION_PARAMS = 106_368             # the lab's default model (LabConfig()): 8 blocks of hidden 32, float32


def shard_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of shard i of a flat vector of `total` elements cut in n as torch.tensor_split does: the first
    total % n shards one element longer."""
    base, extra = divmod(total, n)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def chunk_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of piece i of a flat vector of `total` elements cut as torch.chunk does: ceil(total / n) each,
    the last shorter (and fewer than n pieces where they run out: then empty)."""
    size = -(-total // n)
    return min(total, i * size), min(total, (i + 1) * size)


def zero_bytes(params: int, n: int, element: int = 4) -> dict[str, float]:
    """Bytes per rank, on average, of parameters + gradients + AdamW's two moments: plain data parallel, ZeRO-1
    (the moments sharded), ZeRO-2 (the gradients too), ZeRO-3 (the parameters too)."""
    p = params * element
    return {"dp": 4 * p, "zero1": 2 * p + 2 * p / n, "zero2": p + 3 * p / n, "zero3": 4 * p / n}


def zero_wanted() -> dict[str, float]:
    """q21's prediction's figures: bytes held per rank under data parallel, ZeRO-1 and ZeRO-2, and sent per step
    under ZeRO-2 (a reduce-scatter and an all-gather: 2(n - 1)/n of the parameters), for the default model."""
    z, n = zero_bytes(PREDICTION_PARAMS, PREDICTION_RANKS), PREDICTION_RANKS
    return {"dp": z["dp"], "zero1": z["zero1"], "zero2": z["zero2"], "sent": 2 * (n - 1) / n * PREDICTION_PARAMS * 4}


class ZeroObserved(StageObserved):
    grid: list                  # [dp, pp]
    dp_group: list              # the global ranks of this stage's data-parallel group, in position order
    elements: int               # N: the stage's parameters' elements, flattened
    element_size: int           # bytes per element
    stepping: int               # the step the rank was in when it stopped (absent once every step ran)
    returned: str               # what was wrong with what the step returned, if anything
    steps: list                 # per step: {"params": {name: tensor} after the step, "state_bytes", "state_tensors"
                                #   (how many tensors `state` holds), "largest_state" (elements of its largest),
                                #   "grad_bytes" (.grad still held after the step), "hidden_bytes" (every live
                                #   tensor storage of the rank but the parameters, gradients, `state`'s and the lab's
                                #   records, after the step: harness/live.py), "hidden_largest"
                                #   (bytes of the largest such storage), "sends" / "recvs" ([[peer,
                                #   bytes]]), "collectives": [event kind], and after the first step "state_values"
                                #   (the floating tensors of `state`, flattened: kind.floating_tensors)}
    scan_seconds: float         # the lab's own time scanning the rank's live tensors (harness/live.py), all steps
    own_grad: object            # the replica's own gradient before the first step, flattened (a tensor): with its
                                #   group's, which replicas' gradients the first step's state holds the sum of


# q22: the graded prediction, for a stage of 4 blocks of the default model (hidden 32: 12,704 parameters a block)
FSDP_PREDICTION = "predicted_fsdp_bytes"
FSDP_PREDICTION_KEYS = ("rest", "peak", "gathers")     # "gathers": of one block, in one step, on one rank
FSDP_PREDICTION_RANKS = 4
FSDP_PREDICTION_BLOCKS = 4
BLOCK_PARAMS = 12_704
FSDP_PREDICTION_M = 8


def fsdp_wanted() -> dict[str, float]:
    """The prediction's figures: a rank's bytes of the 4 blocks at rest and at a forward's peak, gathers a step."""
    rest = FSDP_PREDICTION_BLOCKS * BLOCK_PARAMS * 4 / FSDP_PREDICTION_RANKS
    return {"rest": rest, "peak": rest + BLOCK_PARAMS * 4, "gathers": 2 * FSDP_PREDICTION_M}


class FsdpObserved(StageObserved):
    grid: list                  # [dp, pp]
    layers_flat: dict           # block name -> [its flat length, this rank's shard's length]
    replicated_bytes: int       # the parameters every rank holds whole (embedding, head)
    rest_bytes: int             # the replicated parameters' bytes and every tensor the answer's modules reach, at rest
    stepping: int               # the step the rank was in when it stopped (absent once every step ran)
    steps: list                 # per step: "gathers" / "scatters" ([[time, layer, bytes]]), "peak" (the most
                                #   gathered bytes held at once), "peak_layers", "longest" ({layer: seconds a gathered
                                #   copy lived at most}), "left" (layers still gathered after the step), "grads"
                                #   ({name: the whole gradient}; not in a digits training), "loss" (a digits
                                #   training's, on the last stage), "hidden" ([bytes, layer, storages, largest]: the
                                #   tensors the rank held beyond what the lab declared at the first gather of a
                                #   backward, in the first and the last step: harness/live.py; [] elsewhere)
    scan_seconds: float         # the lab's own time scanning the rank's live tensors (harness/live.py), all steps
