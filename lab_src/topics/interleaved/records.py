"""What q15's ranks observe (kind.py) and its judge reads (judge.py), torch-free."""
from __future__ import annotations

from lab_src.harness.observed import StepObserved


class InterleavedObserved(StepObserved):
    chunk_layers: list          # the blocks of each of the rank's v chunks
    waiting: object             # what the stage was waiting for when the step ended (InterleavedStage.waiting)
