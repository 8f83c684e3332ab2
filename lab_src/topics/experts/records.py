"""What q25's kind (kind.py) and judge (judge.py) share, torch-free: a case's settings and layout, the routing rule's
numbers (capacity), the traffic the routing implies, the graded prediction, and the record each rank fills.

The layout: a (dp, ep) mesh of the case's ranks (comm/mesh.py, row-major: global rank = dp_rank * ep + ep_rank). Every
rank reads its own rows of the batch (`batch` sequences of the model's `seq_len` tokens: T = batch * seq_len tokens).
The dense parameters (embedding, attention, router, head) are replicated on every rank; expert e lives on the ep rank
e // L (L = E / ep experts per rank, contiguous), replicated over the dp group of ranks with that ep coordinate.

Capacity: an expert takes at most C = ceil(capacity_factor * T * k / E) of one source rank's assignments (none is
dropped with capacity_factor 0). Assignments are considered first choices first (every token's first choice, in
token order, then every second choice, ...); one that finds its expert full is dropped: its token gets nothing from
that expert (a token with every choice dropped passes through the residual alone).

Traffic per MoE layer and rank, with n_j the kept assignments this rank sends to ep rank j and m_j those it receives
from j: the forward's dispatch sends sum_{j != me} n_j rows of h elements, its combine sends sum_{j != me} m_j back;
the backward sends the same again (the combine's gradient first, then the dispatch's). Each all-to-all of rows is
preceded in the forward by one of counts (integers: what each rank sends to each other). With routing spread evenly
and nothing dropped, each rank sends 2 T k (ep - 1)/ep rows of h e bytes per layer forward (e: bytes per element),
and as many backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings

ITEMSIZE = {"float32": 4, "float64": 8}
PARTS = ("forward", "gradients", "training", "traffic", "routing")
WHAT = {"forward": "the MoE's outputs (logits, each layer's combine)",
        "gradients": "every parameter's gradient after the answer's sync_gradients",
        "training": "three SGD steps: the loss curve",
        "traffic": "the all-to-alls: one counts exchange and two of tokens per layer forward, two backward, their bytes",
        "routing": "the dropped assignments: how many and which"}
STARVED_BIAS = -1.0e4   # the router's bias of the starved rank's experts (a case with `starve`): no token goes there


@dataclass(frozen=True)
class MoeSettings(Settings):
    ep: int = 2                     # expert-parallel degree; the case's ranks / ep data-parallel replicas
    experts: int = 2                # E, a multiple of ep
    k: int = 1                      # experts per token
    capacity_factor: float = 0.0    # 0: no capacity (nothing dropped)
    batch: int = 2                  # sequences per rank
    starve: bool = False            # the last ep rank's experts get a router bias of STARVED_BIAS: it receives no token
    steps: int = 3
    lr: float = 0.05                # SGD
    dtype: str = "float64"

    def __post_init__(self):
        if self.ep < 1 or self.experts % self.ep or not 1 <= self.k <= self.experts:
            raise ValueError(f"a q25 case needs E a multiple of ep and 1 <= k <= E: ep = {self.ep}, E = "
                             f"{self.experts}, k = {self.k}")

    def degrees(self, case) -> dict[str, int]:
        return {"dp": case.stages // self.ep, "ep": self.ep}


def capacity(tokens: int, k: int, experts: int, capacity_factor: float) -> int | None:
    """The most assignments one source rank may send to one expert (None: no capacity)."""
    if not capacity_factor:
        return None
    return math.ceil(capacity_factor * tokens * k / experts)


def local_experts(ep_rank: int, experts: int, ep: int) -> list[int]:
    per = experts // ep
    return list(range(ep_rank * per, (ep_rank + 1) * per))


def off_rank_rows(send_counts: list[int], me: int) -> int:
    return sum(n for j, n in enumerate(send_counts) if j != me)


def even_bytes_per_layer(tokens: int, k: int, hidden: int, ep: int, itemsize: int) -> int:
    """What one rank sends off-rank in one MoE layer's forward (dispatch + combine) when its routing is spread evenly
    over the experts and nothing is dropped: 2 T k (ep - 1)/ep rows of h elements."""
    return 2 * tokens * k * (ep - 1) * hidden * itemsize // ep


# the graded prediction: ep = 4 ranks (dp = 2 replicas of them: 8 ranks), T = 512 tokens per rank, k = 2, h = 64, float32,
# routing spread evenly, nothing dropped
PREDICTION_NAME = "predicted_moe_traffic"
PREDICTION_KEYS = ("forward_bytes", "backward_bytes", "undivided_factor")
PREDICTION_SHAPE = {"tokens": 512, "k": 2, "hidden": 64, "ep": 4, "dp": 2, "dtype": "float32"}


def prediction_wanted() -> dict[str, float]:
    p = PREDICTION_SHAPE
    fwd = even_bytes_per_layer(p["tokens"], p["k"], p["hidden"], p["ep"], ITEMSIZE[p["dtype"]])
    # the experts' gradients summed over their dp group and never divided: the ep ranks' contributions arrive summed
    # through the all-to-all's backward, each of the dp replicas adds its own: ep * dp times the mean's
    return {"forward_bytes": fwd, "backward_bytes": fwd, "undivided_factor": p["ep"] * p["dp"]}


class MoeObserved(Observed):
    coords: dict                # {"dp": d, "ep": e}: the rank's place in the mesh
    owned: list                 # the experts this rank holds
    tokens: int                 # T, the tokens this rank routes per layer
    moe_layers: list            # step 0, per MoE layer: "x" (its input, (T, h)), {"experts", "weights", "keep"} as
                                # route returned them
                                # (tensors, or None), "per_expert" (dispatch's tokens per local expert), "combined"
                                # (combine's output, (T, h)), "raised" where the layer raised (then the case ends)
    logits: object              # step 0's logits of this rank's rows (tensor)
    losses: list                # the rank's mean loss at each step (before its update)
    grads: dict                 # step 0, after sync_gradients: parameter name -> gradient (None where it has none)
    a2a: dict                   # step 0: {"forward": [...], "backward": [...]}, every all-to-all-single the answer
                                # called: {"in": input splits, "out": output splits, "row_bytes", "integer", "members"}
    part: str                   # where the case was when the answer raised ("forward", "backward", "sync", "step k")
