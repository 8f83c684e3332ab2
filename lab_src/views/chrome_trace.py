"""Export a run's events as Chrome-trace JSON, which Perfetto (ui.perfetto.dev) and chrome://tracing open.

Each rank is a thread row; forward, backward, sends, receives and all-reduces (category "collective",
with the ranks taking part) are boxes; every send is joined to its matching receive by a flow arrow.
Where the run counted activation memory, each rank also gets a counter track of the bytes it held for
backward.
"""
from __future__ import annotations

import json
from pathlib import Path

from lab_src.pipeline.matching import match_messages
from lab_src.pipeline.trace import Event


def to_chrome_trace(events: list[Event], title: str = "pipeline step") -> dict:
    us = 1e6
    trace = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": title}}]
    for r in sorted({e.rank for e in events}):
        trace.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        trace.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": r, "args": {"sort_index": r}})
    for e in events:
        if e.is_collective:     # an all-reduce: its own category, and the ranks that took part
            trace.append({"ph": "X", "name": f"{e.kind} {list(e.group or ())}", "cat": "collective", "pid": 0,
                          "tid": e.rank, "ts": e.t_start * us, "dur": max(e.duration * us, 0.001),
                          "args": {"group": list(e.group or ()), "shape": e.shape, "bytes": e.bytes}})
            continue
        name = e.label() if e.is_compute else f"{e.kind} mb{e.microbatch}"
        trace.append({"ph": "X", "name": name, "cat": "compute" if e.is_compute else "p2p", "pid": 0,
                      "tid": e.rank, "ts": e.t_start * us, "dur": max(e.duration * us, 0.001),
                      "args": {"microbatch": e.microbatch, "peer": e.peer, "shape": e.shape, "bytes": e.bytes}})
    for i, (send, recv) in enumerate(match_messages(events)):
        trace.append({"ph": "s", "id": i, "name": "message", "cat": "p2p", "pid": 0, "tid": send.rank,
                      "ts": send.t_start * us})
        trace.append({"ph": "f", "bp": "e", "id": i, "name": "message", "cat": "p2p", "pid": 0, "tid": recv.rank,
                      "ts": max(recv.t_start * us, recv.t_end * us - 0.001)})
    if any(e.held for e in events):         # activation memory: one counter track per rank
        for e in sorted(events, key=lambda e: e.t_end):
            trace.append({"ph": "C", "name": f"rank {e.rank} activation memory", "pid": 0, "ts": e.t_end * us,
                          "args": {"bytes held for backward": e.held}})
    if any(e.state for e in events):        # the training state: one counter track per rank, a series per kind
        from lab_src.views.memory import by_kind
        for e in sorted((e for e in events if e.state), key=lambda e: e.t_end):
            trace.append({"ph": "C", "name": f"rank {e.rank} memory by kind", "pid": 0, "ts": e.t_end * us,
                          "args": by_kind(e)})
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(events: list[Event], path: Path, title: str = "pipeline step") -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(events, title)))
    return path
