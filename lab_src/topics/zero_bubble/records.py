"""What q16's split test observes (kind.py) and its judge reads (judge.py), torch-free."""
from __future__ import annotations

from lab_src.harness.observed import StageObserved


class SplitObserved(StageObserved):
    split_stages: dict          # stage -> the two halves against one backward: gradients, operations, memory left
