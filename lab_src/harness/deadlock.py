"""Deadlocks, from the journals the ranks write as they go (harness/runfolder.py).

While a launch runs, `Progress` follows the journals line by line and says when a case is stuck: every
one of its ranks either waits in a receive whose message no rank has sent, waits in a collective that a
member of its group will not join (that member has done its part, or is stuck elsewhere), or has done its
part (it will send nothing more). Nothing can change that, so the launching process stops the case at once
(harness/runner.py) instead of waiting for the group's timeout. A send counts from the moment it
begins (B, or P for a posted one): the watch errs towards "a message is on its way", never towards
stopping a run that could go on. A stage posts its sends (B and E as it posts them) and, at the end of
its step, waits for their delivery (PipelineStage.flush): a send still undelivered then is journalled A
again, and E once delivered (where the stage's ranks are the launch's, as the journal's peers must be).
The rank has done its part, but it is held there until its peer posts the receive: when every rank has
done its part and one of them is held so by a peer that posts nothing more (a peer that raised), the
case is stuck too. Code that journals a send and a receive as one operation would hide the send from it:
journal each send on its own (comm/messages.py does, for raw torch.distributed calls).

A rank may work in more than one thread (a lane: pipeline/trace.py `Tracer.lane`, q20's reducing thread):
each lane's operation is followed on its own, and messages are counted per pair of ranks whatever the lane (on
a grid, the pipeline's pairs and the data-parallel ring's are never the same).

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

from lab_src.harness.records import ENDED_WITHOUT_RETURNING, RankError
from lab_src.harness.runfolder import journal_path, read_journal
from lab_src.pipeline.ops import Op
from lab_src.pipeline.trace import BARRIER, LANE_IDLE, LANE_WAIT, Pending, op_text


def describe_op(kind: str, mb, peer, chunk: int = 0) -> str:
    if kind == BARRIER:
        return f"the barrier that ends this part of the case, with ranks {peer}"
    if kind == LANE_WAIT:
        return f"a wait for what its lane {peer} does (a thread of the rank)"
    if kind == LANE_IDLE:
        return "nothing to do (a thread of the rank waiting for work)"
    op = Op.of(kind)
    if op is None:              # a collective: its `peer` is the list of ranks taking part
        return f"{kind} over ranks {peer}"
    if op.is_compute:
        return f"{op.letter}{mb}" + (f"c{chunk}" if chunk else "")
    return f"{op_text(kind, mb, chunk)} {'to' if op.is_send else 'from'} rank {peer}"


def rank_state(journal: Path, case_index: int) -> dict:
    """What one rank's journal says about one case."""
    state = {"started": False, "ended": False, "last_done": None, "pending": None}
    label = str(case_index)
    waiting: list[str] = []     # begun and not ended; posted messages (q11) may be several at once
    for _, tag, payload in read_journal(journal):
        if tag == "C":
            if payload == f"start {case_index}":
                state["started"] = True
            elif payload == f"end {case_index}":
                state["ended"] = True
        elif tag in ("B", "P", "E") and payload and payload[0] == label:
            p = Pending.from_list(payload)
            if p.kind == LANE_IDLE:     # a lane with nothing to do waits in nothing
                continue
            op = describe_op(p.kind, p.microbatch, p.peer, p.chunk) + (f" in its lane {p.lane}" if p.lane else "")
            if tag in ("B", "P"):
                waiting.append(op)
            elif op not in waiting:     # the end of a wait for a send's delivery (PipelineStage.flush): no
                continue                # operation of its own, the send ended when it was posted
            else:
                if p.kind != BARRIER:       # through a barrier is no operation done
                    state["last_done"] = op
                if op in waiting:
                    waiting.remove(op)
    state["pending"] = " and ".join(waiting) or None
    return state


def recover(journal: Path, case_index: int, rank: int, stopped_at: float) -> dict:
    """What a rank that left no observations (its launch was stopped, or it died) did in a case, from
    its journal: its events (without shapes or sizes) and the operation it was still in, in the form
    of a rank's observations (harness/observe.py, worker.py)."""
    label, begun, events, pending = str(case_index), {}, [], {}      # pending: lane -> [(operation, since)], the
    for t, tag, payload in read_journal(journal):                      # innermost last (a wait for an inline lane)
        if tag not in ("B", "P", "A", "E") or not payload or payload[0] != label:
            continue
        op = Pending.from_list(payload)
        if op.kind in (BARRIER, LANE_IDLE):     # not an operation of the run
            continue
        key = repr(op.what)
        if tag in ("A", "E") and not begun.get(key):
            continue                    # the wait for a send's delivery (PipelineStage.flush): the send ended
        if tag in ("B", "P"):           # when it was posted, and the rank had done its part
            begun.setdefault(key, []).append(t)
        if tag in ("B", "A"):
            stack = pending.setdefault(op.lane, [])
            stack[:] = [p for p in stack if p[0].what != op.what] + [(op, t)]
        elif tag == "E":
            start = begun[key].pop(0)
            if op.kind != LANE_WAIT:    # a wait for the rank's own lane is no event
                events.append([rank, op.kind, op.microbatch, op.peer, None, 0, start, t, op.chunk]
                              + ([0, None, op.lane] if op.lane else []))
            pending[op.lane] = [p for p in pending.get(op.lane, []) if p[0].what != op.what]
    pending = {lane: stack[-1] for lane, stack in pending.items() if stack}
    error = None
    if pending:             # what its main thread waited in, else a lane's
        op, since = pending.get(0) or pending[min(pending)]
        error = RankError("Stopped", "the run was stopped while this rank waited", pending=op,
                          pending_since=since, at=stopped_at).to_dict()
    return {"events": events, "error": error, "recovered": True}


def report(run_dir: Path, case_index: int, ranks: range, done_ranks=(), exited=None) -> str:
    """One line per rank. `done_ranks` finished their part of the case (they saved observations);
    `exited` maps ranks whose process died to their exit code."""
    lines = []
    for r in ranks:
        s = rank_state(journal_path(run_dir, r), case_index)
        if exited and r in exited:
            last = f" after {s['last_done']}" if s["last_done"] else ""
            how = f"exited with code {exited[r]}" if exited[r] != ENDED_WITHOUT_RETURNING else \
                "ended with status 0 before its work was done (os._exit, or a process killed)"
            lines.append(f"rank {r}: its process {how}{last}"
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
def group_of(kind: str, members: list) -> tuple | str:
    """What the collectives a rank takes part in are counted by: their ranks, or the case's barrier."""
    return BARRIER if kind == BARRIER else tuple(sorted(members))


@dataclass
class RankProgress:
    started: bool = False
    finished: bool = False              # journalled W: it sends nothing more in this case
    pending: Pending | None = None      # the operation it is in
    pending_since: float | None = None  # its journal time
    pending_tag: str = ""               # B: an operation it is in; A: the wait for a message it posted
    delivering: tuple | None = None     # (peer, n): it waits for the delivery of its n-th send to peer, a
                                        # send that ended when it was posted (PipelineStage.flush)


@dataclass
class Stuck:
    """A case in which no rank can go on."""
    case: int
    waits: dict[int, tuple]             # rank -> (kind, mb, peer, since, chunk): receives nothing will answer,
                                        # sends nothing will take
    finished: list[int]                 # ranks that did their part
    unreceived: dict[tuple, list]       # (sender, receiver) -> the sends posted that no receive took
    absent: dict[int, list] = field(default_factory=dict)   # rank in a collective -> its members not in it
    lanes: dict[tuple, tuple] = field(default_factory=dict)  # (rank, lane >= 1) -> as `waits`: a thread's wait

    def lines(self) -> list[str]:
        """One line per rank (and one per lane of a rank that waits in one), then the cycle of waits if any."""
        out = []
        for r in sorted([*self.waits, *self.finished]):
            for (rank, lane), (kind, mb, peer, _, chunk) in sorted(self.lanes.items()):
                if rank == r:
                    out.append(f"rank {r}'s lane {lane} (a thread of the rank) waits in "
                               f"{describe_op(kind, mb, peer, chunk)}")
            if r in self.waits:
                kind, mb, peer, _, chunk = self.waits[r]
                them = self.absent.get(r, [])
                absent = f"rank{'s' if len(them) > 1 else ''} {', '.join(map(str, them))}"
                if kind == BARRIER:
                    out.append(f"rank {r} has done this part of the case and waits for {absent} at its end")
                    continue
                out.append(f"rank {r} waits in {describe_op(kind, mb, peer, chunk)}" + (
                    f", which {absent} will not join" if them else ""))
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
                if self.waits[r][0] == LANE_WAIT:   # it waits for a thread of its own, not for a rank
                    r = None
                    break
                r = self.waits[r][2]
                if not isinstance(r, int):      # a collective: it waits for a group, not for one rank
                    break
            if r in path:
                return path[path.index(r):] + [r]
        return None


class Progress:
    """What the journals of a launch have said so far, fed line by line (`feed`) while it runs."""

    def __init__(self):
        self.ranks: dict[tuple[int, int], RankProgress] = defaultdict(RankProgress)   # (case, rank): its lane 0
        self.lanes: dict[tuple[int, int], dict[int, RankProgress]] = defaultdict(lambda: defaultdict(RankProgress))
        #                                                      (case, rank) -> its lanes >= 1
        self.posted: dict[tuple, list] = defaultdict(list)      # (case, src, dst) -> [(kind, mb)] sent
        self.claimed: Counter = Counter()                        # (case, src, dst) -> receives begun or posted
        self.ordinals: dict[tuple, list] = defaultdict(list)    # (case, rank, op) -> n of its open receives
        self.sent: dict[tuple, list] = defaultdict(list)        # (case, rank, op) -> n of each send begun, kept
                                                                # after its E: the stage's flush waits for it later
        self.joined: Counter = Counter()        # (case, rank, group) -> collectives over it begun (group:
                                                # its sorted ranks, or BARRIER for the case's barriers)
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
        if tag == "W":
            self.ranks[(case, rank)].finished = True
            return
        if len(payload) < 4:
            return
        pending = Pending.from_list(payload)
        state = self.lanes[(case, rank)][pending.lane] if pending.lane else self.ranks[(case, rank)]
        kind, mb, peer = pending.kind, pending.microbatch, pending.peer
        op = Op.of(kind)
        key = (case, rank, repr(pending.what))
        if op is not None and op.is_send and tag in ("A", "E") and not self.ordinals.get(key) \
                and self.sent.get(key) and isinstance(peer, int):
            # the wait for a send's delivery at the end of a step (PipelineStage.flush): no operation of its
            # own. Of sends of the same name (one per step of a training run), the first whose receive the
            # peer has not posted: the rank waits for that one, now or once the earlier ones are delivered
            took = self.claimed[(case, rank, peer)]
            state.delivering = None if tag == "E" else \
                (peer, next((n for n in self.sent[key] if n > took), self.sent[key][-1]))
            return
        if tag in ("B", "P", "A"):
            state.finished = False          # a W holds until the rank begins another operation
            state.delivering = None
        if tag in ("B", "P"):               # B: the rank is in it now; P: posted, the rank goes on
            if tag == "B":
                state.pending, state.pending_since, state.pending_tag = pending, t, tag
                if isinstance(peer, list):  # a collective, or the barrier: the n-th of its group
                    self.joined[(case, rank, group_of(kind, peer))] += 1
            if op is not None and op.is_send and isinstance(peer, int):
                # counted when it begins: a message on its way, or about to be; a wait for it (A) ends
                # when `peer` has posted the receive that takes it (gloo's sends wait for their receive)
                self.posted[(case, rank, peer)].append((kind, mb))
                self.ordinals[key].append(len(self.posted[(case, rank, peer)]))
                self.sent[key].append(len(self.posted[(case, rank, peer)]))
            elif op is not None and op.is_recv and isinstance(peer, int):
                # gloo matches a peer's messages to the receives in the order they were posted: this
                # receive takes the n-th message that `peer` sends to this rank
                self.claimed[(case, peer, rank)] += 1
                self.ordinals[key].append(self.claimed[(case, peer, rank)])
        elif tag == "A":                    # waits for a message it posted
            state.pending, state.pending_since, state.pending_tag = pending, t, tag
        elif tag == "E":
            if state.pending is not None and state.pending.what == pending.what:
                state.pending = state.pending_since = None
            if self.ordinals.get(key):
                self.ordinals[key].pop(0)

    def _done(self, case: int, rank: int) -> bool:
        state = self.ranks.get((case, rank))
        return state is not None and state.finished

    def stuck(self, case: int, stages: int) -> Stuck | None:
        """The case's state if no rank of it can go on, else None. A rank can do nothing more when it
        waits in a receive (blocking, or the wait of a posted one) that takes the n-th message from its
        peer, and the peer has sent fewer than n (gloo matches messages by peer, in the order the receives
        were posted, whatever their labels); when it waits for a posted send (q11's raw calls) that is the
        n-th to its peer, and the peer has posted fewer than n receives from it (a gloo send waits for its
        receive); when it is in a send whose peer has done its part (it posts no more receives) with fewer
        than n posted, as after a rank that raised once its gradient was sent, or waits at the case's
        barrier (it posts nothing before the others are there); or when it has done its part. When every
        rank has done its part, the case ends, unless one of them waits for the delivery of a send that
        its peer has posted no receive for (PipelineStage.flush): nobody will post it. A rank in a
        collective, or at the case's barrier, can do nothing more when a member of its group is not in it
        and will not get there: it has done its part (at the barrier, that counts as there), or it is in
        some other operation, itself stuck (every rank of a stuck case is). A rank computing, posting a
        send, in a collective all its members are in, or between operations, may go on: then nothing is
        stuck. A rank's other lanes (threads: pipeline/trace.py `Tracer.lane`) are judged as its main one,
        each on its own: one that may go on keeps the case going, and so does one between two operations; one
        that says it waits for work from its main thread (LANE_IDLE), or that never journalled anything, is
        idle; and a main thread that waits for a lane (LANE_WAIT) is stuck when every operation the lane could
        still do is: that lane is stuck or idle."""
        waits, finished, absent, lanes = {}, [], {}, {}
        for r in range(stages):
            s = self.ranks.get((case, r))
            if s is None or not s.started:
                return None
            for lane, other in self.lanes.get((case, r), {}).items():
                if other.pending is None:
                    return None                 # busy between two operations: it may go on
                if other.pending.kind == LANE_IDLE:
                    continue                    # an idle lane: it waits for work from the rank's main thread
                blocked = self._blocked(case, r, other, stages)
                if blocked is None:
                    return None                 # the lane goes on
                lanes[(r, lane)] = blocked[0]
            if s.finished:
                finished.append(r)
                continue
            if s.pending is None:
                return None
            if s.pending.kind == LANE_WAIT:     # waits for a lane that is stuck, or idle (it goes on otherwise:
                waits[r] = (LANE_WAIT, None, s.pending.peer, s.pending_since, 0)    # then we returned above)
                continue
            blocked = self._blocked(case, r, s, stages)
            if blocked is None:
                return None
            waits[r] = blocked[0]
            if blocked[1] is not None:
                absent[r] = blocked[1]
        if not waits:
            held = {r: self.ranks[(case, r)].delivering for r in finished if self.ranks[(case, r)].delivering}
            if not held or any(self.claimed[(case, r, peer)] >= n for r, (peer, n) in held.items()):
                return None                     # everybody is done: the case is ending normally
            # every rank has done its part, and one waits for a send's delivery that no rank will take
        unreceived = {(src, dst): sends[self.claimed[(c, src, dst)]:]
                      for (c, src, dst), sends in self.posted.items()
                      if c == case and len(sends) > self.claimed[(c, src, dst)]}
        return Stuck(case, waits, finished, unreceived, {r: a for r, a in absent.items() if r in waits}, lanes)

    def _blocked(self, case: int, r: int, s: RankProgress, stages: int) -> tuple | None:
        """None if the operation `s` (rank r's, or one of its lanes') may go on; else (its wait: kind, mb, peer,
        since, chunk; for a collective, the members that will not join it, else None)."""
        p = s.pending
        kind, mb, peer, chunk = p.kind, p.microbatch, p.peer, p.chunk
        wait = (kind, mb, peer, s.pending_since, chunk)
        if isinstance(peer, list):              # a collective over the ranks `peer`, or the case's barrier
            them = self._not_joining(case, r, kind, peer, stages)
            return (wait, them) if them else None   # every member is in it: it goes on
        op = Op.of(kind)
        if op is None or op.is_compute or not isinstance(peer, int):
            return None
        ordinal = (self.ordinals.get((case, r, repr(p.what))) or [None])[0]
        if ordinal is None:
            return None
        if op.is_recv and len(self.posted[(case, peer, r)]) >= ordinal:
            return None                         # its message is on its way
        if op.is_send and (self.claimed[(case, r, peer)] >= ordinal or not (
                s.pending_tag == "A" or self._done(case, peer) or self._held_at_barrier(case, peer, stages))):
            return None                         # its receive is posted; or its peer may still post it
        return wait, None

    def _not_joining(self, case: int, rank: int, kind: str, members: list, stages: int) -> list[int]:
        """The members of `rank`'s collective over `members` (its n-th over that group) that will not join
        it. A member that has begun n collectives over the group is in it, or through it (its E may not be
        journalled yet); one that has begun fewer will not join it when it has done its part, or is in
        another operation (only a case where every rank is stuck is stopped, so that operation is stuck
        too). The case's barrier is a group of its own (it goes through the store and matches no
        collective), where a member that has done its part counts as there (harness/case_barrier.py). A
        member outside the case is nobody's to judge, and one between operations may still come: then
        none is named and the collective counts as going on."""
        group = group_of(kind, members)
        n = self.joined[(case, rank, group)]
        out = []
        for m in members:
            if m == rank:
                continue
            if not isinstance(m, int) or not 0 <= m < stages:
                return []
            s = self.ranks.get((case, m))
            if s is None or not s.started:
                return []
            if self.joined[(case, m, group)] >= n:
                continue                        # in it, or through it
            if s.finished:
                if kind != BARRIER:
                    out.append(m)
                continue
            if s.pending is None:
                return []                       # busy between operations: it may come
            out.append(m)
        return out

    def _held_at_barrier(self, case: int, rank: int, stages: int) -> bool:
        """Whether `rank` waits at its case's barrier for a rank not there yet: then it posts nothing."""
        state = self.ranks.get((case, rank))
        p = state.pending if state is not None else None
        return p is not None and p.kind == BARRIER and bool(self._not_joining(case, rank, BARRIER, p.peer, stages))
