"""What q13's kind (kind.py) and its judge (judge.py) share, torch-free: the training's settings, and the
record each rank fills."""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import StageObserved
from lab_src.harness.settings import Settings, settings_of


@dataclass(frozen=True)
class TrainSettings(Settings):
    steps: int = 30
    lr: float = 3e-3
    test_microbatches: int | None = None
    perturb: bool = False


DEFAULTS = TrainSettings().to_dict()
# how far a pipeline's loss curve may stray from one process's, relative, step by step (judge.py says why)
CURVE_RTOL = {"float32": 1e-5, "float64": 1e-10}


def settings(case) -> dict:
    """A training case's settings: its own (`Case.settings`) over the defaults (TrainSettings), as a dict."""
    return settings_of(case).to_dict()


def curve_tolerance(dtype: str) -> float:
    return CURVE_RTOL.get(dtype, CURVE_RTOL["float32"])


def relative_differences(got: list[float], want: list[float]) -> list[float]:
    return [abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, want)]


class TrainObserved(StageObserved):
    step_spans: list            # per step: [events before, forwards before, events after, forwards after, m]
    optimizer: dict             # what the optimizer did (OptimizerWatch.record)
    returned: object            # what the training loop returned, recorded
    params: dict                # parameter name -> its value after training
    forwards: list              # the last stage's forwards: training or evaluation, with or without autograd
    reads: dict                 # what the rank read of the digits, by split
