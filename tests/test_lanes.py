"""A rank's lanes (pipeline/trace.py): a thread of the rank other than its main one has its own operation in
progress, and what it journals and records carries its lane, while lane 0's journal lines and event rows stay
as they always were (old journals and saved views still load). The first step of q20's second lane (lab_src/topics/data_parallel/README.md)."""
from __future__ import annotations

import threading
import time

from lab_src.pipeline.trace import Event, Pending, Tracer


def test_each_thread_has_its_own_operation_in_progress_and_journals_its_lane():
    journal = []
    tracer = Tracer(0, journal=lambda tag, row: journal.append((tag, row)), label="3")
    inside, release, seen = threading.Event(), threading.Event(), {}

    def reduce_in_lane_1():
        with tracer.lane(1):
            with tracer.span("send_forward", None, 2, shape=(4,), nbytes=16):
                seen["lane 1"] = tracer.pending
                inside.set()
                release.wait(5)
        seen["lane 1 after"] = tracer.pending

    with tracer.span("backward", 3):
        thread = threading.Thread(target=reduce_in_lane_1)
        thread.start()
        assert inside.wait(5)
        assert tracer.pending.kind == "backward" and tracer.pending.lane == 0     # the main thread's own
        release.set()
        thread.join(5)
    assert seen["lane 1"].kind == "send_forward" and seen["lane 1"].lane == 1
    assert seen["lane 1 after"] is None and tracer.pending is None
    assert ("B", ["3", "backward", 3, None]) in journal                   # lane 0: as it always was
    assert ("B", ["3", "send_forward", None, 2, 0, 1]) in journal          # lane 1: chunk 0, then the lane
    assert ("E", ["3", "send_forward", None, 2, 0, 1]) in journal
    lanes = {e.kind: e.lane for e in tracer.events}
    assert lanes == {"send_forward": 1, "backward": 0}
    assert tracer.current_lane == 0


def test_a_wait_for_a_lane_is_the_main_threads_operation_while_it_lasts():
    from lab_src.pipeline import trace
    journal = []
    tracer = Tracer(0, journal=lambda tag, row: journal.append((tag, row)), label="2")
    with trace.tracing(tracer):
        with trace.waiting_for_lane(1):
            assert tracer.pending.kind == trace.LANE_WAIT and tracer.pending.peer == 1
        assert tracer.pending is None
    assert journal == [("B", ["2", "wait_lane", None, 1]), ("E", ["2", "wait_lane", None, 1])]
    assert not tracer.events                         # the lane's own operations are its events


def test_a_lanes_pending_and_event_travel_and_old_rows_still_load():
    for p in (Pending("0", "recv_forward", 2, 1), Pending("0", "forward", 2, None, chunk=1),
              Pending("1", "send_backward", None, 3, 0, 1), Pending("1", "allreduce_dp", None, [0, 2], 0, 2)):
        assert Pending.from_list(p.to_list()) == p
    assert Pending("0", "recv_forward", 2, 1).to_list() == ["0", "recv_forward", 2, 1]
    plain = Event(0, "forward", 1, None, (2, 3), 24, 0.5, 0.75, 0, 100)
    coll = Event(0, "allreduce_dp", None, None, (8,), 32, 0.5, 0.75, group=(0, 2))
    laned = Event(1, "send_forward", None, 3, (8,), 32, 0.5, 0.75, lane=1)
    assert len(plain.to_row()) == 10 and len(coll.to_row()) == 11 and len(laned.to_row()) == 12
    for e in (plain, coll, laned):
        assert Event.from_row(list(e.to_row())) == e
    assert Event.from_row([0, "forward", 1, None, [2, 3], 24, 0.5, 0.75]).lane == 0     # 8 fields, as before chunk


def _watch(n: int):
    import time

    from lab_src.harness.deadlock import Progress
    p = Progress()

    def feed(rank, *lines):
        for tag, payload in lines:
            p.feed(rank, time.perf_counter(), tag, payload)
    for r in range(n):
        feed(r, ("C", "start 0"))
    return p, feed


def test_a_lane_that_waits_for_a_bucket_its_peer_never_launched_is_a_deadlock_the_watch_names():
    """q20's reducer: each rank's lane 1 runs the ring over the data-parallel group while the main thread goes
    on. Rank 1 never launched its bucket (its lane has nothing to do) and waits for its lane at the end of the
    step; rank 0's lane waits for rank 1's first message of the ring. Nothing can change that."""
    p, feed = _watch(2)
    feed(0, ("B", ["0", "backward", 3, None]), ("E", ["0", "backward", 3, None]),
         ("B", ["0", "wait_lane", None, 1]))
    feed(0, ("P", ["0", "send_forward", None, 1, 0, 1]), ("P", ["0", "recv_backward", None, 1, 0, 1]),
         ("A", ["0", "send_forward", None, 1, 0, 1]))
    feed(1, ("B", ["0", "backward", 3, None]))
    assert p.stuck(0, 2) is None                      # rank 1 computes: it may still launch the bucket
    feed(1, ("E", ["0", "backward", 3, None]), ("B", ["0", "wait_lane", None, 1]))
    stuck = p.stuck(0, 2)
    assert stuck is not None and stuck.cycle() is None
    assert stuck.lines() == [
        "rank 0's lane 1 (a thread of the rank) waits in a send to rank 1",
        "rank 0 waits in a wait for what its lane 1 does (a thread of the rank)",
        "rank 1 waits in a wait for what its lane 1 does (a thread of the rank)"]
    feed(1, ("P", ["0", "send_backward", None, 0, 0, 1]), ("P", ["0", "recv_forward", None, 0, 0, 1]))
    assert p.stuck(0, 2) is None                      # had rank 1 launched it, both rings go on


def test_a_lane_that_goes_on_keeps_the_case_going_and_lanes_do_not_take_the_main_threads_place():
    """Ranks 0 and 1 are a pipeline whose main threads wait for each other; ranks 0 and 2 a data-parallel pair
    whose lanes reduce a bucket (on a grid the two never share a pair of ranks). While the lanes go on, so
    does the case, between two of their messages too; once they say they wait for work, the main threads' cycle
    is what is left."""
    p, feed = _watch(3)
    feed(0, ("B", ["0", "recv_forward", 0, 1]))
    feed(1, ("B", ["0", "recv_backward", 0, 0]))
    feed(2, ("W", ["0"]))
    feed(0, ("B", ["0", "send_forward", None, 2, 0, 1]))
    feed(2, ("B", ["0", "recv_backward", None, 0, 0, 1]))
    assert p.stuck(0, 3) is None
    assert p.ranks[(0, 0)].pending.kind == "recv_forward" and p.lanes[(0, 0)][1].pending.lane == 1
    assert p.ranks[(0, 2)].finished                  # a lane's operation does not undo its rank's W
    feed(0, ("E", ["0", "send_forward", None, 2, 0, 1]))
    feed(2, ("E", ["0", "recv_backward", None, 0, 0, 1]))
    assert p.stuck(0, 3) is None                     # lanes between two operations (a ring's next message) go on
    feed(0, ("B", ["0", "lane_idle", None, None, 0, 1]))
    feed(2, ("B", ["0", "lane_idle", None, None, 0, 1]))
    stuck = p.stuck(0, 3)
    assert stuck is not None and stuck.cycle() == [0, 1, 0] and not stuck.lanes and stuck.finished == [2]


def test_a_stopped_ranks_journal_says_which_lane_waited(tmp_path):
    from lab_src.harness.deadlock import rank_state, recover
    from lab_src.harness.runfolder import journal_path, op_line
    path = journal_path(tmp_path, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(op_line(tag, row) for tag, row in [
        ("B", ["0", "backward", 3, None]), ("E", ["0", "backward", 3, None]),
        ("B", ["0", "wait_lane", None, 1]),
        ("P", ["0", "recv_backward", None, 1, 0, 1]), ("A", ["0", "recv_backward", None, 1, 0, 1])]))
    state = rank_state(path, 0)
    assert state["last_done"] == "B3"
    assert state["pending"] == ("a wait for what its lane 1 does (a thread of the rank) and a receive from "
                                "rank 1 in its lane 1")
    got = recover(path, 0, 0, stopped_at=0.0)
    assert got["error"]["pending"][:4] == ["0", "wait_lane", None, 1]      # the main thread's wait first


def test_two_lanes_wait_at_once_each_in_a_wait_the_check_can_stop():
    """pipeline/waiting.py runs a blocking wait in a helper thread so that the check can stop it. A rank's
    lanes wait at the same time (the main thread for a pipeline message, lane 1 for a ring's): each thread
    has its own helper, so the lane's wait ends when its message is there, whatever the main thread waits for."""
    from lab_src.pipeline import waiting

    class Work:
        def __init__(self):
            self.ready = threading.Event()

        def wait(self):
            assert self.ready.wait(10), "never released"
            return True

    pipeline_message, ring_message, lane_done = Work(), Work(), threading.Event()
    with waiting.stop_when(lambda: None):
        main = threading.Thread(target=waiting.wait, args=(pipeline_message,))
        main.start()                                  # blocks until the pipeline's message comes
        lane = threading.Thread(target=lambda: (waiting.wait(ring_message), lane_done.set()))
        lane.start()
        ring_message.ready.set()
        assert lane_done.wait(5), "the lane's wait queued behind the main thread's"
        pipeline_message.ready.set()
        main.join(5)
        lane.join(5)
    assert not main.is_alive() and not lane.is_alive()


def test_a_lanes_events_are_drawn_in_a_thin_row_under_their_rank():
    """q20's second lane, drawn (lab_src/topics/data_parallel/README.md): a lane's messages (q20's buckets) over the main thread's backward boxes,
    in the static figure and in the widget's frame, their arrows joining the lanes' rows."""
    import xml.etree.ElementTree as ET

    from lab_src.views import svg
    from lab_src.views.prepare import LANE_STEP, prepare, row_of
    from lab_src.views.timeline import static_figure
    ev = [Event(0, "backward", 0, None, None, 0, 0.030, 0.050), Event(1, "backward", 0, None, None, 0, 0.020, 0.040),
          Event(0, "send_forward", None, 1, (8,), 32, 0.035, 0.040, lane=1),
          Event(1, "recv_forward", None, 0, (8,), 32, 0.034, 0.040, lane=1)]
    assert [row_of(e) for e in ev] == [0, 1, LANE_STEP, 1 + LANE_STEP]
    figure = static_figure(ev, 2, 1, with_ideal=False)
    ax = figure.axes[0]
    assert sum(t.get_text() == "its lane 1" for t in ax.texts) == 2
    bars = [b for b in ax.patches if abs(b.get_x() - 15.0) < 1e-6]     # the lane's send, 15 ms after the first box
    assert bars and abs(bars[0].get_y() + bars[0].get_height() / 2 - LANE_STEP) < 1e-9
    frame = svg.frame(prepare(ev, 2, 1))
    ET.fromstring(frame)                                                    # well-formed
    assert frame.count("its lane 1") == 2


def test_lanes_comparing_their_buckets_in_a_collective_all_are_in_go_on():
    """q20's lanes compare the bucket they are about to sum (a small all-gather, journalled as a collective) while
    the main threads wait for them: every member in it, so it goes on; a member whose main thread still computes
    may yet join. (Unjournalled, the lanes looked idle there, and a grading once stopped a right answer.)"""
    p, feed = _watch(2)
    for r in (0, 1):
        feed(r, ("B", ["0", "lane_idle", None, None, 0, 1]), ("E", ["0", "lane_idle", None, None, 0, 1]),
             ("B", ["0", "wait_lane", None, 1]))
    feed(0, ("B", ["0", "allreduce_dp", None, [0, 1], 0, 1]))
    assert p.stuck(0, 2) is None                      # rank 1's lane has work and is between operations: it may join
    feed(1, ("B", ["0", "allreduce_dp", None, [0, 1], 0, 1]))
    assert p.stuck(0, 2) is None                      # both in it
    feed(1, ("E", ["0", "allreduce_dp", None, [0, 1], 0, 1]), ("B", ["0", "lane_idle", None, None, 0, 1]))
    assert p.stuck(0, 2) is None                      # rank 1's lane went through it: rank 0's completes too


def test_a_lanes_ring_is_drawn_and_named_as_the_data_parallel_all_reduce():
    """Issue 55, item 3: q20's lane-1 ring messages were grey "receive (waiting)" bars and phase-coloured arrows where
    the notebook's bucket figure (topics/data_parallel/figure.py) draws the rings in purple, "data-parallel
    all-reduce": the timeline colours and names them as the figure does, and the main lane's messages as before."""
    from lab_src.views import scene as sc
    from lab_src.views import svg
    from lab_src.views.prepare import COLORS, prepare
    from lab_src.views.timeline import static_figure
    ev = [Event(0, "backward", 0, None, None, 0, 0.030, 0.050), Event(1, "backward", 0, None, None, 0, 0.020, 0.040),
          Event(0, "send_forward", 0, 1, (8,), 32, 0.010, 0.012), Event(1, "recv_forward", 0, 0, (8,), 32, 0.010, 0.013),
          Event(0, "send_forward", None, 1, (8,), 32, 0.035, 0.040, lane=1),
          Event(1, "recv_forward", None, 0, (8,), 32, 0.034, 0.040, lane=1)]
    s = sc.scene(prepare(ev, 2, 1, align=False))
    purple = COLORS["allreduce_dp"]
    assert {b.colour for b in s.boxes if b.event.lane} == {purple}
    assert {b.colour for b in s.boxes if not b.event.lane and not b.event.is_compute} == {COLORS["send"], COLORS["recv"]}
    assert {a.colour for a in s.arrows if a.pair[0].lane} == {purple}
    assert {a.colour for a in s.arrows if not a.pair[0].lane} == {COLORS["forward"]}
    label = "data-parallel all-reduce: your ring's messages (lane 1)"
    assert label in [i.label for i in s.legend]
    figure = static_figure(ev, 2, 1, with_ideal=False)
    assert label in [t.get_text() for t in figure.legends[0].get_texts()]
    assert f">{label}</text>" in svg.frame(prepare(ev, 2, 1, align=False))
    # a run with no lane names no ring
    assert label not in [i.label for i in sc.scene(prepare(ev[:4], 2, 1, align=False)).legend]


def _inline_journal(rank: int, lines: list, ring=None):
    """What a rank's q22 forward journals around a gather on its inline ring (comm/lanes.py `inline`): the forward,
    then the ring's messages in lane 1 (`ring(tracer)` journals them), fed to `lines` as (rank, tag, payload)."""
    from lab_src.comm import lanes
    from lab_src.pipeline import trace
    tracer = trace.Tracer(rank, journal=lambda tag, payload: lines.append((rank, tag, payload)), label="0")
    try:
        with tracer.span("forward", 0):
            with lanes.inline(tracer):
                if ring is not None:
                    ring(tracer)
    except _StillWaiting:                   # the journal as it stands while the ring waits
        pass
    return tracer


class _StillWaiting(Exception):
    pass


def _waits_to_send_to(peer: int):
    def ring(tracer):
        tracer.awaits(tracer.begin("send_forward", None, peer, posted=True))
        raise _StillWaiting
    return ring


def test_an_inline_ring_waiting_for_a_rank_that_raised_is_stuck_and_one_that_is_done_is_idle():
    """q22's gathers run the ring inline, inside a forward: the main line waits for its lane meanwhile, and the lane
    has nothing to do once the ring is done. Rank 0's ring waits for rank 1, which raised (W) as it built its
    blocks: stuck at once (it waited to the case's deadline: torch.chunk's shards). And a rank whose ring is done and
    whose main line waits for a message of a rank that raised is stuck too: its lane does not keep the case going
    (a backward without torch.enable_grad() waited to the deadline)."""
    lines: list = []
    _inline_journal(0, lines, ring=_waits_to_send_to(1))
    _inline_journal(2, lines)              # a ring that ran to its end, then a receive its raised peer never sends
    lines.append((2, "B", ["0", "recv_backward", 0, 3]))
    p, feed = _watch(4)
    for rank, tag, payload in lines:
        feed(rank, (tag, payload))
    assert p.stuck(0, 4) is None            # ranks 1 and 3 are still at work
    feed(1, ("W", ["0"]))
    feed(3, ("W", ["0"]))
    stuck = p.stuck(0, 4)
    assert stuck is not None and sorted(stuck.finished) == [1, 3], stuck
    assert stuck.lanes[(0, 1)][0] == "send_forward" and stuck.waits[2][0] == "recv_backward"
    feed(3, ("B", ["0", "send_backward", 0, 2]))
    assert p.stuck(0, 4) is None            # had rank 3 sent, rank 2 would go on


def test_a_stopped_ranks_journal_after_an_inline_ring_says_it_was_in_its_forward(tmp_path):
    """After a gather's inline ring is done, the rank is in its forward again: the journal's report names the
    forward (not the lane's idleness), and the wait for the lane is no event."""
    from lab_src.harness.deadlock import rank_state, recover
    from lab_src.harness.runfolder import journal_path, op_line
    lines: list = []
    _inline_journal(0, lines, ring=lambda t: t.record(Event(0, "send_forward", None, 1, (4,), 16, 0.0, 0.001),
                                                      t.begin("send_forward", None, 1)))
    path = journal_path(tmp_path, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = [(tag, payload) for _, tag, payload in lines if not (tag == "E" and payload[1] == "forward")]
    path.write_text("".join(op_line(tag, payload) for tag, payload in kept))
    assert rank_state(path, 0)["pending"] == "F0"
    got = recover(path, 0, 0, stopped_at=0.0)
    assert got["error"]["pending"][:2] == ["0", "forward"]
    assert [e[1] for e in got["events"]] == ["send_forward"]


def test_a_wait_lets_go_of_its_work_before_the_waiting_thread_goes_on(monkeypatch):
    """The helper thread that waits on a work drops it before it wakes the waiting thread: the work holds the
    message's tensors, and a memory scan right after the wait (q23's sequence-parallel block scans after its last
    reduce-scatter) found them alive, or not, as the two threads ran (CI: the reference kept 12,288 B more than the
    closed form, a reduce-scatter's input and output, once). Here the helper is held up right after it wakes the
    waiting thread, as a loaded machine may hold it."""
    import weakref

    from lab_src.pipeline import waiting

    class Work:
        def wait(self, timeout=None):
            pass

    class HeldUpAfterSet(threading.Event):      # set by the helper alone: the wait's own event
        def set(self):
            super().set()
            time.sleep(0.02)

    left = []
    with waiting.stop_when(lambda: None):
        waiting.wait(Work())                    # the helper thread starts (a thread's start sets events of its own)
        monkeypatch.setattr(waiting.threading, "Event", HeldUpAfterSet)
        for _ in range(10):
            work = Work()
            ref = weakref.ref(work)
            waiting.wait(work, poll_s=0.001)
            del work
            left.append(ref() is not None)
    assert not any(left), f"{sum(left)} of 10 works still held by the helper after their wait"
