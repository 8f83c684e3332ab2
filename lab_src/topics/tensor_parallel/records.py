"""What the tensor-parallel kinds (kind_*.py) and judges (judge_*.py) share, torch-free: the parts a q18 block
case tries and their configurations, and the record each kind's ranks fill."""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings


@dataclass(frozen=True)
class BlockSettings(Settings):
    parts: list | None = None           # the parts tried (all of BLOCK_PARTS by default)
    replicas: int = 1                   # tensor-parallel groups side by side (the layout of grid_members)

    def degrees(self, case) -> dict[str, int]:
        return {"tp": case.stages // self.replicas, "pp": self.replicas}


@dataclass(frozen=True)
class TrainSettings(Settings):
    t: int = 2                          # tensor-parallel degree; the case's ranks / t pipeline stages
    steps: int = 20
    lr: float = 1e-2
    seed_policy: str = "answer"         # the notebook's experiment (checks/tp_seeds.py): a wrong policy in its place
    perturb: bool = False               # stage 0 changes its embedding once, by an amount drawn outside the ranks

    def degrees(self, case) -> dict[str, int]:
        """Rank g is stage g % p and tensor-parallel rank g // p (grid_members)."""
        return {"tp": self.t, "pp": case.stages // self.t}

# AdamW's eps in q18's trainings, on the ranks and in one process alike (torch's default is 1e-8). AdamW's first
# step moves each parameter by lr g / (|g| + eps): about lr whatever |g| is, where |g| is far above eps, so with
# 1e-8 an element whose gradient is zero but for rounding (a sum whose terms cancel) moves by +lr or -lr as its
# rounding falls. The ranks add their sums in another order than one process does: with 1e-8, one seed in 40 of
# the embedding's change put the reference's curve 5e-5 from one process's (five times the tolerance) by step 1,
# from one element of the head. With 1e-4 such an element moves by lr |g| / eps, a rounding's worth: 41 seeds of
# float32 against float64 in one process, 3e-7 apart at most; 48 graded trainings of the reference, 1.0e-6 at
# most. It also makes q18_norm_grads_reduced's gradients, t times the LayerNorms', show in the curves (3.7e-4 to
# 5.8e-4 apart): with 1e-8 AdamW's scale invariance hid them in some runs and not in others.
ADAM_EPS = 1e-4

LAYER_PARTS = ("copy", "reduce", "column", "row", "mlp")   # q17's parts, in the order a case runs them
BLOCK_PARTS = ("block", "dropout")                          # q18's block cases: dropout off, then on
BLOCK_DROPOUT = 0.2             # the dropout of q18's "dropout" part: high enough that a wrong mask shows
# each part in words, as a judge names it and as a rank names the part its answer raised in (Observed.caught)
BLOCK_WHAT = {"block": "the block (dropout off)", "dropout": f"the block with dropout {BLOCK_DROPOUT}"}
LAYER_WHAT = {"copy": "CopyToTensorParallel", "reduce": "ReduceFromTensorParallel", "column": "ColumnParallelLinear",
              "row": "RowParallelLinear", "mlp": "tp_layers' MLP"}


def block_config(cfg, t: int, dropout: float = 0.0):
    """`cfg` with the block's dropout, its attention masks drawn per shard of t (pipeline/dropout.py)."""
    return cfg.replace(dropout=dropout, dropout_shards=t if dropout else 1)


def part_config(part: str, cfg, t: int):
    """The configuration a q18 block case of `part` runs on t ranks."""
    return block_config(cfg, t, BLOCK_DROPOUT if part == "dropout" else 0.0)


def grid_members(s: int, t: int, p: int) -> list[int]:
    """The global ranks of tensor-parallel group s of a t x p grid (ranks k * p + s, k < t): q18's trainings
    lay pipeline stages out this way, and its block's grid case (kind_block, `replicas`) the groups side by side.
    Rank k * p + s is tp.rank k: in every group but the first, a global rank is not the tensor-parallel one."""
    return [k * p + s for k in range(t)]


class LayersObserved(Observed):
    tp: dict                    # q17's part -> what the rank observed of it (kind_layers.py)


class BlockObserved(Observed):
    tp_block: dict              # q18's part ("block", "dropout") -> what the rank observed of it (kind_block.py)


class TrainObserved(Observed):
    grid: list                  # [t, p]
    stage: int                  # the rank's pipeline stage
    tp_ranks: list              # the global ranks of its tensor-parallel group
    params: int                 # the parameters the rank holds
    losses: list                # the loss after each step (the last stage's)
    step_events: list           # per step, the events it recorded
    sent_bytes: int             # what the rank sent to the next stage
    norms: dict                 # the replicated LayerNorms after training
    perturbed: int              # the seed of the lab's change to stage 0's embedding (pipeline/perturb.py)
