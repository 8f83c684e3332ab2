"""What q14's kind (kind.py) and judges (judge.py, judge_numbers.py) share, torch-free: the layout every answer
must keep (global rank = dp_rank * pp_size + pp_rank: pipeline d is the row of ranks d*pp .. d*pp+pp-1, the
data-parallel set of stage p the column p, p+pp, ...; the tied pair of pipeline d its first and last rank),
and the record each rank fills."""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import StageObserved
from lab_src.pipeline.config import TIED_NAMES  # noqa: F401 - q14's judges read it here


@dataclass(frozen=True)
class Layout:
    dp: int
    pp: int

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp_rank, pp_rank) of a global rank."""
        return divmod(rank, self.pp)

    def pipeline(self, d: int) -> list[int]:
        return [d * self.pp + p for p in range(self.pp)]

    def dp_set(self, p: int) -> list[int]:
        return [d * self.pp + p for d in range(self.dp)]

    def tied_pair(self, d: int) -> list[int]:
        return sorted({d * self.pp, d * self.pp + self.pp - 1})

    def name(self, ranks: list[int]) -> str:
        """What a group of these ranks is in this layout, if anything ('pipeline 1', ...)."""
        ranks = sorted(ranks)
        for d in range(self.dp):
            if ranks == self.pipeline(d) and len(ranks) > 1:
                return f"pipeline {d} (ranks holding different stages)"
        for p in range(self.pp):
            if ranks == self.dp_set(p) and len(ranks) > 1:
                return f"the data-parallel set of stage {p}"
        if ranks == list(range(self.dp * self.pp)):
            return "every rank"
        return ""


def layout_of(case) -> Layout:
    return Layout(case.config.dp_size, case.config.num_stages)


class GridObserved(StageObserved):
    grid: list                  # [dp, pp]: the grid's shape
    link: dict                  # the measured cost of a message and an all-reduce on this machine
    groups_created: list        # the ranks of each group the answer created
    shards: list                # the data shards the answer's dataloaders read
    returned: str               # what was wrong with what the step returned, if anything
    outputs: list
    loss: float
    pp_rank: int
    pp_size: int
    pipeline_group: list        # the global ranks of the stage's pipeline group
    grads: dict
    weights: dict               # parameter name -> the sum of its values before the step
    tied_after_step: object     # the tied embedding after the step (a tensor), where the stage holds it
