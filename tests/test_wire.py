"""The bytes on the wire, counted outside the ranks (lab_src/harness/wire.py, fence.py; lab_src/judge/wire.py).

Fast: the kernel's counts of a connection read through sock_diag; a fence answered by the watch with its reading;
the judge's sums on made-up counts. Multi-process: a graded q19 in the sandbox, where the fork server hands the
grader its namespace's sock_diag socket, reads every rank's bytes: the reference's record matches them, and a ring
of zeros whose sum came from torch's unrecorded all_reduce is named by its bytes.
"""
from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from lab_src.harness import fence, wire


def _pair():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    server.close()
    return client, accepted


def test_the_kernel_counts_each_connections_bytes():
    client, accepted = _pair()
    try:
        client.sendall(b"x" * 100_000)
        got = 0
        while got < 100_000:
            got += len(accepted.recv(1 << 16))
        accepted.sendall(b"y" * 1_000)
        client.recv(1 << 16)
        mine = wire.socket_inodes(os.getpid())
        conns = {c.inode: c for c in wire.dump(wire.open_diag()) if c.inode in mine}
        by_port = {c.local[1]: c for c in conns.values()}
        sender = by_port[client.getsockname()[1]]
        receiver = by_port[accepted.getsockname()[1]] if accepted.getsockname()[1] in by_port else None
        assert sender.sent == 100_000 and sender.received == 1_000
        assert receiver is not None and receiver.received == 100_000
    finally:
        client.close()
        accepted.close()


def test_a_fence_waits_for_the_watch_which_reads_the_rank(tmp_path):
    client, accepted = _pair()
    watch = wire.WireWatch(tmp_path, sandboxed=False)
    try:
        watch.attach(wire.open_diag())
        fence.arm(tmp_path, 0)
        fence.start(7)
        client.sendall(b"z" * 50_000)
        got = 0
        while got < 50_000:
            got += len(accepted.recv(1 << 16))
        assert fence.end(7)
        watch.stop()
        count = watch.count(7, 0)
        # both ends are this process, the "rank 0": a connection to itself is not counted as sent to a peer
        assert count is not None and count.readings == ("start 7", "end 7") and count.unread == 0
        assert count.sent == 0 and watch.readings[0][1][1].conns
    finally:
        fence._armed.clear()
        watch.stop()
        client.close()
        accepted.close()


def test_what_a_rank_sends_after_a_case_is_read_up_to_its_next_case_counted_or_not(tmp_path):
    """`after` closes at the rank's next case: where that case is not counted (another kind's, in a submission's
    launch), its fence is `pass`, and that case's own traffic is not the counted case's."""
    watch = wire.WireWatch(tmp_path, sandboxed=False)
    watch.stop()
    mine, theirs = (("127.0.0.1", 5000), ("127.0.0.1", 6000))

    def reading(sent):
        conn = wire.Conn(1, mine, theirs, sent, 0, 0)
        return wire.Reading(0.0, {1: conn}, peers={1: 2})
    watch.holders = {1: {0}, 2: {1}}
    watch.readings[0] = [("start 0", reading(0)), ("end 0", reading(1_000)), ("pass 1", reading(1_200)),
                         ("start 2", reading(5_000_000)), ("end 2", reading(5_001_000))]
    first = watch.count(0, 0)
    assert first.sent_to == {1: 1_000} and first.after == 200
    last = watch.count(2, 0)
    assert last.sent_to == {1: 1_000} and last.after == 0


def test_a_counted_cases_groups_close_after_its_end(tmp_path):
    """Inside a counted case, closing a mesh's connections waits until the worker says every rank is past its end
    fence (their counts are read first); outside one, it is done at once."""
    closed = []
    fence._armed.clear()
    assert fence.after_end(lambda: closed.append("unarmed")) is False
    fence.arm(tmp_path, 0)
    try:
        fence._armed["case"] = 3             # as fence.start(3) leaves it, without a watch to answer
        assert fence.after_end(lambda: closed.append("case 3")) is True and closed == []
        fence._armed["case"] = None
        assert fence.after_end(lambda: closed.append("between")) is False
        fence.run_after_end()
        assert closed == ["case 3"] and not fence._later
    finally:
        fence._armed.clear()
        fence._later.clear()


def test_an_unarmed_fence_does_nothing():
    fence._armed.clear()
    t = time.monotonic()
    assert fence.here("anything") is False and fence.end(3) is False
    assert time.monotonic() - t < 0.1


def test_the_judge_names_bytes_no_message_carried_and_messages_never_sent():
    from types import SimpleNamespace

    from lab_src.judge.wire import byte_problems
    from lab_src.pipeline.trace import Event

    def outcome(sent: int, recorded: int, lab: int = 0):
        row = Event(0, "send_forward", 0, 1, (recorded // 4,), recorded, 1.0, 1.1).to_row()
        obs = {0: {"events": [row], "lab_sent": lab}, 1: {"events": []}}
        count = wire.WireCount(sent_to={1: sent}, readings=("start 0", "end 0"))
        return SimpleNamespace(case=SimpleNamespace(stages=2), obs=obs, failure=None, wire_failed=None,
                               wire={0: count, 1: wire.WireCount(readings=("start 0", "end 0"))}, wire_unseen=None, wire_loopback=None)

    assert byte_problems(outcome(1_000_300, 1_000_000)) == []
    assert byte_problems(outcome(1_300_000, 1_000_000, lab=300_000)) == []
    extra = byte_problems(outcome(2_000_000, 1_000_000))
    assert len(extra) == 1 and extra[0].rank == 0
    assert "1,000,000 bytes left rank 0 for other ranks that no message of its record carried" in extra[0].message
    assert "250,000 float32 elements" in extra[0].message
    # fewer bytes than the record is not judged: a connection may close with its last counts unread (gloo closes one
    # end while bytes are still on their way)
    assert byte_problems(outcome(100, 1_000_000)) == []


def test_recorded_collectives_vouch_for_their_bytes_and_their_framing():
    """A rank's recorded collectives count as gloo's ring algorithms send them, all-to-alls too ((n - 1)/n of the
    input: q24's Ulysses), and each of their messages is allowed its framing as a point-to-point message is (q25's
    many small collectives, an all-reduce per parameter, went over the allowance of the messages alone)."""
    from types import SimpleNamespace

    from lab_src.comm.collectives import wire_bytes, wire_messages
    from lab_src.judge.wire import byte_problems, recorded_collectives
    from lab_src.pipeline.trace import Event

    assert wire_bytes("all_to_all_single", [1_200_000, 1_200_000], 4) == 900_000
    assert wire_bytes("all_to_all", [1_200_000], 4) == 900_000
    assert [wire_messages(name, 4) for name in ("all_reduce", "all_gather", "all_to_all_single", "barrier")] == \
        [6, 3, 3, 3]
    assert wire_messages("all_reduce", 1) == 0
    group = (0, 1, 2, 3)
    rows = [Event(0, "all_to_all", None, None, (300_000,), 1_200_000, 1.0, 1.1, group=group).to_row()] + \
        [Event(0, "all_reduce", None, None, (16,), 64, 2.0, 2.1, group=group).to_row() for _ in range(100)]
    assert recorded_collectives({"events": rows}) == (900_000 + 100 * 96, 3 + 600)

    def outcome(sent: int):
        count = wire.WireCount(sent_to={1: sent}, readings=("start 0", "end 0"))
        return SimpleNamespace(case=SimpleNamespace(stages=4), obs={0: {"events": rows}}, failure=None,
                               wire_failed=None, wire={0: count}, wire_unseen=None, wire_loopback=None)

    framed = 900_000 + 100 * 96 + 603 * 300            # every message framed (gloo: 200 to 320 bytes here)
    assert byte_problems(outcome(framed)) == []
    extra = byte_problems(outcome(framed + 600_000))    # K and V of another all-to-all, sent around the recorder
    assert len(extra) == 1 and "collectives that send 909,600 bytes" in extra[0].message, extra


def test_a_sandboxed_grading_reads_every_ranks_bytes_and_names_an_unrecorded_sum(reference, tmp_path, no_leftovers):
    from grader.cohort.answers import answer
    from lab_src.harness import sandbox
    if not sandbox.available():
        pytest.skip(sandbox.describe_unavailable())
    from hidden_grading import grade_answer
    reference = {k: str(v) for k, v in reference.items()}
    right = grade_answer("q19", Path(reference["q19"]).read_text(), reference, tmp_path / "right", sandboxed=True)
    assert right["fraction"] == 1.0, right["messages"]
    forged = grade_answer("q19", answer("q19_zeros_original"), reference, tmp_path / "forged", sandboxed=True)
    text = " ".join(" ".join(forged["messages"]).split())
    assert forged["fraction"] < 1.0 and "that no message of its record carried" in text, forged["messages"]
