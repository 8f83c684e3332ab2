"""What q11's ranks observe (kind.py) and its judge reads (judge.py), torch-free."""
from __future__ import annotations

from lab_src.harness.observed import StageObserved


class P2PObserved(StageObserved):
    probes: dict                # {"noop_ends": ...}: the operations at the ends of the pipeline
    calls: list                 # each call the rank made, in order, with what it got back
    raw_messages: int           # messages made with torch.distributed's own calls (comm/messages.py RECORDED)
