"""Deadlocks, from the journals the ranks write as they go (harness/runfolder.py).

While a launch runs, `Progress` follows the journals line by line and says when a case is stuck: every
one of its ranks either waits in a receive whose message no rank has sent, or has done its part (it
will send nothing more). Nothing can change that, so the launching process stops the case at once
(harness/runner.py) instead of waiting for the receive's timeout. A send counts from the moment it
begins (B): the watch errs towards "a message is on its way", never towards stopping a run that could
go on. Code that journals a send and a receive as one operation would hide the send from it: journal
each send on its own.

After a run that did not finish, `report` gives, for each rank, the last operation it completed and
the operation it is still waiting in:

    rank 0: done with send_forward(mb=3) to rank 1; waits in recv_backward(mb=0) from rank 1
    rank 1: done with F3; waits in recv_forward(mb=4) from rank 0
"""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lab_src.pipeline.schedules import Op
from lab_src.harness.runfolder import journal_path, read_journal


def describe_op(kind: str, mb, peer) -> str:
    op = Op(kind)
    if op.is_compute:
        return f"{kind[0].upper()}{mb}"
    return f"{kind}(mb={mb}) {'to' if op.is_send else 'from'} rank {peer}"


def rank_state(journal: Path, case_index: int) -> dict:
    """What one rank's journal says about one case."""
    state = {"started": False, "ended": False, "last_done": None, "pending": None}
    label = str(case_index)
    for _, tag, payload in read_journal(journal):
        if tag == "C":
            if payload == f"start {case_index}":
                state["started"] = True
            elif payload == f"end {case_index}":
                state["ended"] = True
        elif tag in ("B", "E") and payload and payload[0] == label:
            op = describe_op(*payload[1:4])
            if tag == "B":
                state["pending"] = op
            else:
                state["last_done"], state["pending"] = op, None
    return state


def recover(journal: Path, case_index: int, rank: int, stopped_at: float) -> dict:
    """What a rank that left no observations (its launch was stopped, or it died) did in a case, from
    its journal: its events (without shapes or sizes) and the operation it was still in, in the form
    of a rank's observations (harness/cases.py, worker.py)."""
    label, begun, events, pending = str(case_index), {}, [], None
    for t, tag, payload in read_journal(journal):
        if tag not in ("B", "E") or not payload or payload[0] != label:
            continue
        kind, mb, peer = payload[1:4]
        if tag == "B":
            begun[(kind, mb, peer)], pending = t, (payload, t)
        else:
            start = begun.pop((kind, mb, peer), t)
            events.append([rank, kind, mb, peer, None, 0, start, t, 0])
            pending = None
    error = None
    if pending is not None:
        error = {"type": "Stopped", "message": "the run was stopped while this rank waited", "where": [],
                 "pending": pending[0], "pending_since": pending[1], "at": stopped_at}
    return {"events": events, "error": error, "recovered": True}


def report(run_dir: Path, case_index: int, ranks: range, done_ranks=(), exited=None) -> str:
    """One line per rank. `done_ranks` finished their part of the case (they saved observations);
    `exited` maps ranks whose process died to their exit code."""
    lines = []
    for r in ranks:
        s = rank_state(journal_path(run_dir, r), case_index)
        if exited and r in exited:
            last = f" after {s['last_done']}" if s["last_done"] else ""
            lines.append(f"rank {r}: its process exited with code {exited[r]}{last}"
                         + (f", in {s['pending']}" if s["pending"] else ""))
            continue
        if not s["started"]:
            lines.append(f"rank {r}: never started this case")
            continue
        done = f"done with {s['last_done']}" if s["last_done"] else "no operation finished"
        if s["pending"]:
            lines.append(f"rank {r}: {done}; waits in {s['pending']}")
        elif r in done_ranks or s["ended"]:
            lines.append(f"rank {r}: {done}; finished its part and waits for the other ranks")
        else:
            lines.append(f"rank {r}: {done}; busy outside any send, receive, forward or backward "
                         f"(a loop in the code, or waiting at a barrier)")
    return "\n".join(lines)


# ---- while a launch runs -----------------------------------------------------------------------------
@dataclass
class RankProgress:
    started: bool = False
    finished: bool = False              # journalled W: it sends nothing more in this case
    pending: list | None = None         # [case, kind, mb, peer] of the operation it is in
    pending_since: float | None = None  # its journal time


@dataclass
class Stuck:
    """A case in which no rank can go on."""
    case: int
    waits: dict[int, tuple]             # rank -> (kind, mb, peer, since): receives nothing will answer
    finished: list[int]                 # ranks that did their part
    unreceived: dict[tuple, list]       # (sender, receiver) -> the sends posted that no receive took

    def lines(self) -> list[str]:
        """One line per rank, then the cycle of waits if there is one."""
        out = []
        for r in sorted([*self.waits, *self.finished]):
            if r in self.waits:
                kind, mb, peer, _ = self.waits[r]
                out.append(f"rank {r} waits in {describe_op(kind, mb, peer)}")
            else:
                sent = [f"{k}(mb={mb})" for (src, dst), ops in sorted(self.unreceived.items()) if src == r
                        for k, mb in ops]
                dsts = sorted({dst for (src, dst), ops in self.unreceived.items() if src == r and ops})
                out.append(f"rank {r} has done its part" + (
                    f"; its {', '.join(sent)} to rank {', '.join(map(str, dsts))} never got a matching receive"
                    if sent else ""))
        cycle = self.cycle()
        if cycle:
            out.append("they wait for each other in a cycle: " + " -> ".join(f"rank {r}" for r in cycle))
        return out

    def cycle(self) -> list[int] | None:
        """Ranks that wait for each other in a circle (r0 waits for r1 ... waits for r0), if any."""
        for start in sorted(self.waits):
            path, r = [], start
            while r in self.waits and r not in path:
                path.append(r)
                r = self.waits[r][2]
            if r in path:
                return path[path.index(r):] + [r]
        return None


class Progress:
    """What the journals of a launch have said so far, fed line by line (`feed`) while it runs."""

    def __init__(self):
        self.ranks: dict[tuple[int, int], RankProgress] = defaultdict(RankProgress)   # (case, rank)
        self.posted: dict[tuple, list] = defaultdict(list)      # (case, src, dst) -> [(kind, mb)] sent
        self.received: Counter = Counter()                       # (case, src, dst) -> receives completed
        self.changed_at = time.monotonic()

    def feed(self, rank: int, t: float, tag: str, payload) -> None:
        self.changed_at = time.monotonic()
        if tag == "C":
            what, _, index = str(payload).partition(" ")
            if what == "start" and index.isdigit():
                self.ranks[(int(index), rank)].started = True
            return
        if not isinstance(payload, list) or not payload or not str(payload[0]).isdigit():
            return
        case = int(payload[0])
        state = self.ranks[(case, rank)]
        if tag == "W":
            state.finished = True
        elif tag == "B":
            state.pending, state.pending_since = payload, t
            kind, mb, peer = payload[1:4]
            op = Op.of(kind)
            if op is not None and op.is_send:     # counted when it begins: a message on its way, or about to be
                self.posted[(case, rank, peer)].append((kind, mb))
        elif tag == "E":
            state.pending = state.pending_since = None
            kind, mb, peer = payload[1:4]
            op = Op.of(kind)
            if op is not None and op.is_recv:
                self.received[(case, peer, rank)] += 1

    def stuck(self, case: int, stages: int) -> Stuck | None:
        """The case's state if no rank of it can go on, else None. A receive can go on when its peer
        posted more messages to it than it took (gloo matches messages by peer, whatever their labels)."""
        waits, finished = {}, []
        for r in range(stages):
            s = self.ranks.get((case, r))
            if s is None or not s.started:
                return None
            if s.finished:
                finished.append(r)
                continue
            if s.pending is None:
                return None
            kind, mb, peer = s.pending[1:4]
            op = Op.of(kind)
            if op is None or not op.is_recv or not isinstance(peer, int):
                return None
            if len(self.posted[(case, peer, r)]) > self.received[(case, peer, r)]:
                return None                     # its message is on its way
            waits[r] = (kind, mb, peer, s.pending_since)
        if not waits:
            return None                         # everybody is done: the case is ending normally
        unreceived = {(src, dst): sends[self.received[(c, src, dst)]:]
                      for (c, src, dst), sends in self.posted.items()
                      if c == case and len(sends) > self.received[(c, src, dst)]}
        return Stuck(case, waits, finished, unreceived)
