"""The emulated-compute view (lab_src/views/emulated.py, issue 41 item 1): a run's own operations, in its
order, with every compute box a cost model's length, so that a study on 4 ranks of a 2-core hub shows its
schedule's bubble whatever else the machine runs. No launch here: the runs are the schedule model's."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from lab_src.pipeline.trace import Event
from lab_src.views.bubble import measured_bubble
from lab_src.views.emulated import LABEL, box_times, emulated_events
from lab_src.views.ideal import CostModel, ideal_events

FREE = CostModel(forward_s_per_layer=1e-3, backward_s_per_layer=2e-3, latency_s=0.0, bandwidth_bytes_per_s=1e30)


@pytest.mark.parametrize("name,p,m", [("afab", 4, 4), ("1f1b", 4, 8), ("zbh1", 4, 8), ("interleaved:2", 4, 8),
                                      ("1f1b", 2, 16)])
def test_a_loaded_run_replays_to_its_schedules_own_bubble(name, p, m):
    """The same schedule run where messages were slow (5 ms each) and the boxes of one rank twice as long (the
    wall clock of a shared CPU): its replay with the model's box lengths is the model's step, to the box."""
    model = ideal_events(p, m, FREE, schedule=name, activation_bytes=4096)
    slow = ideal_events(p, m, replace(FREE, latency_s=5e-3), schedule=name, activation_bytes=4096,
                        stage_layers=[2] + [1] * (p - 1))
    assert measured_bubble(slow, p) != pytest.approx(measured_bubble(model, p), abs=0.01)
    replayed = emulated_events(slow, p, box_times(model), cost=FREE)
    assert measured_bubble(replayed, p) == pytest.approx(measured_bubble(model, p), abs=1e-9)
    def boxes(events):
        return sorted((e.rank, round(e.t_start, 9), e.kind, e.microbatch) for e in events)
    assert boxes(replayed) == boxes(model)


def test_the_replay_keeps_the_students_order_not_the_schedules():
    """ZB-H1's boxes with each W moved right after its own I (vera's q16 mistake: 1F1B with a split backward):
    the replay draws that order's bubble, 1F1B's, not ZB-H1's."""
    p, m = 4, 8
    zb = ideal_events(p, m, FREE, schedule="zbh1")
    times = box_times(zb)
    moved = []
    for r in range(p):
        mine = sorted((e for e in zb if e.rank == r), key=lambda e: e.t_start)
        ws = {e.microbatch: e for e in mine if e.kind == "backward_weight"}
        order = []
        for e in mine:
            if e.kind != "backward_weight":
                order.append(e)
            if e.kind == "backward_input":
                order.append(ws[e.microbatch])
        moved += [replace(e, t_start=float(i), t_end=i + 0.5) for i, e in enumerate(order)]
    got = measured_bubble(emulated_events(moved, p, times, cost=FREE), p)
    assert got == pytest.approx(measured_bubble(ideal_events(p, m, FREE, schedule="1f1b"), p), abs=1e-9)
    assert got > measured_bubble(emulated_events(zb, p, times, cost=FREE), p) + 0.1


def test_a_send_and_a_receive_posted_together_do_not_deadlock_the_replay():
    """q11's send_forward_recv_backward posts both at once, and the recorded receive may begin first: the
    replay sends first (the rank did not wait for its receive before sending)."""
    def ev(rank, kind, mb, peer, t0, t1):
        return Event(rank, kind, mb, peer, None, 8, t0, t1)
    events = [ev(0, "forward", 0, None, 0.0, 1.0), ev(1, "forward", 0, None, 0.0, 1.0),
              ev(0, "recv_backward", 0, 1, 1.0, 2.0), ev(0, "send_forward", 0, 1, 1.01, 1.02),
              ev(1, "recv_forward", 0, 0, 1.0, 2.0), ev(1, "send_backward", 0, 0, 1.01, 1.02)]
    replayed = emulated_events(events, 2, {"forward": 1.0}, cost=FREE)
    assert replayed is not None and len(replayed) == len(events)


def test_a_run_that_did_not_finish_has_no_replay():
    events = [Event(0, "forward", 0, None, None, 0, 0.0, 1.0), Event(0, "recv_backward", 0, 1, None, 8, 1.0, 2.0)]
    assert emulated_events(events, 2) is None


def test_the_studys_figure_is_labelled_emulated_compute(monkeypatch):
    """A study's view with `emulate` draws the measured run over its emulated replay, each panel saying which."""
    from lab_src.views.saved import draw
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")         # the static figure, not the widget
    events = ideal_events(4, 8, replace(FREE, latency_s=2e-3), schedule="1f1b", activation_bytes=4096)
    view = {"events": events, "stages": 4, "microbatches": 8, "schedule": "1f1b", "stage_layers": None,
            "label": "m = 8", "emulate": {}}
    titles = [ax.get_title(loc="left") for ax in draw(view).axes]
    assert [t.split(":")[0] for t in titles] == ["measured", LABEL]
    assert "27.3%" in titles[1] and "in its order" in titles[1], titles
    from lab_src.views.widget import TimelineWidget
    from lab_src.views.timeline import timelines
    widget = TimelineWidget(*timelines(events, 4, 8, schedule="1f1b", emulate={}))
    assert list(widget.views) == ["measured", LABEL] and re.search(f"measured: <b>63.1%</b>.*{LABEL}: 30.8%", widget.side.value)
