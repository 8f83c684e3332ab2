"""A rank's record of what it sent, held against the bytes the kernel counted leaving it (harness/wire.py).

The record of a rank's messages is kept in its own process, where the answer runs, and an answer can step
around the recorder (torch's own functions are in its reach) or rewrite what it wrote. The bytes on its
connections are counted by the kernel and read by the launching process at the case's fences, so:

- bytes sent to other ranks that no recorded message carried (beyond gloo's framing and the lab's own few
  hundred bytes) were sent by a call the record does not show: a collective made through torch's saved
  originals, a process group's own methods, a group of the answer's own ... whatever made it, its bytes are named;
- bytes the sandbox's loopback carried in the case that no connection read accounts for travelled on a
  connection opened and closed between two readings (a process group made and destroyed inside the answer);

When a message left is not judged from these counts: the kernel counts a byte when it is transmitted, and a sent
message may wait in its socket's buffer until the receiver reads (a record's times are held against the journal
the grader read during the run instead: q20's launches, topics/data_parallel/judge_buckets.py).

Nothing is judged where nothing could be read (no sock_diag socket, another kernel: `CaseOutcome.wire_failed`).
"""
from __future__ import annotations

from lab_src.judge.problems import Problem
from lab_src.pipeline.trace import Event

# gloo frames each message and each receive posted (measured: about 200 to 320 bytes a message on loopback here), a
# collective's messages as a point-to-point one's (comm/collectives.py `wire_messages`);
# the lab's own traffic in a case is the case-end flag all-reduce and the mesh's handshakes, under 8 KiB here
FRAME_BYTES = 400
SLACK_BYTES = 16 << 10
SHARE = 0.02                  # of the recorded bytes: framing of large messages split by gloo
UNSEEN_LIMIT = 256 << 10      # loopback bytes no TCP socket accounts for (the references: up to 66 KB a case here)
UNSEEN_SHARE = 0.01           # of the case's loopback bytes (headers estimated, not counted: 1 % at 100 MB a case)


def recorded_sends(obs) -> list[Event]:
    return [e for e in (Event.from_row(row) for row in obs.get("events") or []) if e.is_send]


def recorded_collectives(obs) -> tuple[int, int]:
    """(bytes, messages) the answer's recorded collectives (comm/collectives.py's kinds) sent from this rank, as
    gloo's ring algorithms send them: each message is framed, as a point-to-point message is."""
    from lab_src.comm.collectives import KINDS, wire_bytes, wire_messages
    names = {kind: name for name, kind in KINDS.items()}
    total = messages = 0
    for e in (Event.from_row(row) for row in obs.get("events") or []):
        if e.kind in names and e.group:
            total += wire_bytes(names[e.kind], [e.bytes], len(e.group)) if e.bytes else 0
            messages += wire_messages(names[e.kind], len(e.group))
    return total, messages


def _counted(outcome):
    """(rank, its record, its count) for each rank judged: one that completed, where anything was read."""
    if outcome.wire_failed or not outcome.wire or outcome.failure:
        return
    for rank in range(outcome.case.stages):
        obs = outcome.obs.get(rank)
        if obs is None or obs.get("error"):
            continue                    # a rank that raised: its record stops where it did
        yield rank, obs, outcome.wire.get(rank)


def byte_problems(outcome) -> list[Problem]:
    """Each rank's record against its bytes on the wire, one problem per rank and cause."""
    problems: list[Problem] = []
    for rank, obs, count in _counted(outcome):
        if count is None:
            problems.append(Problem(
                f"rank {rank} skipped the moments where the grader counts its bytes on the wire (the case's fences): "
                f"nothing vouches for the messages it recorded", rank=rank))
            continue
        if count.unread:
            continue
        sends = recorded_sends(obs)
        messages = sum(e.bytes for e in sends)
        collective_bytes, collective_messages = recorded_collectives(obs)
        recorded = messages + collective_bytes + (obs.get("lab_sent") or 0)
        allowed = SLACK_BYTES + FRAME_BYTES * (len(sends) + collective_messages) + SHARE * recorded
        extra = count.sent + count.after - recorded       # up to the rank's next case: the lab's flag, a few hundred B
        if extra > allowed:
            problems.append(Problem(
                f"{extra:,} bytes left rank {rank} for other ranks that no message of its record carried: it recorded "
                f"{len(sends)} messages of {messages:,} bytes"
                + (f" and collectives that send {collective_bytes:,} bytes" if collective_bytes else "")
                + f" (and the lab's own traffic, {recorded - messages - collective_bytes:,} "
                f"bytes), and the kernel counted {count.sent:,} bytes on its "
                f"connections to them. A call the lab does not record (torch's own all_reduce reached around the "
                f"recorder, a process group's own methods, a group of the answer's) still sends its bytes: these are "
                f"{extra // 4:,} float32 elements' worth, sent beside the messages the record shows", rank=rank))
    unseen = outcome.wire_unseen
    if problems or not outcome.wire or outcome.wire_failed or outcome.failure:
        return problems
    if unseen is not None and unseen > UNSEEN_LIMIT + UNSEEN_SHARE * (outcome.wire_loopback or 0):
        problems.append(Problem(
            f"{unseen:,} bytes travelled between the ranks of this case on connections opened and closed between the "
            f"grader's readings (a process group made and destroyed inside the answer): no record shows them"))
    return problems
