"""Unit tests of lab_src.views (the timeline): message matching, clock alignment, the ideal schedule, both drawings.

Fast and without a browser or torchrun: the events are made by the ideal cost model and then
perturbed. The end-to-end test in a real JupyterLab is tests/test_timeline_browser.py.
"""
from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from lab_src.views import chrome_trace, text_grid
from lab_src.views.bubble import theoretical_bubble
from lab_src.views.clocks import clock_offsets, shift
from lab_src.views.timeline import (CostModel, UnmatchedMessages, calibrate, check_matching, ideal_events, match,
                                    match_messages, prepare, show, static_figure, timelines)
from lab_src.pipeline.trace import COMPUTE, RECVS, SENDS, Event

FREE_LINKS = CostModel(forward_s_per_layer=1e-3, backward_s_per_layer=2e-3, latency_s=0.0,
                       bandwidth_bytes_per_s=math.inf)


@pytest.fixture
def afab():
    """A 4-stage, 4-micro-batch AFAB step with slightly uneven compute, as a real run would record."""
    rng = random.Random(0)
    events = ideal_events(4, 4, activation_bytes=4096, shape=(2, 16, 32))
    return [replace(e, t_end=e.t_end + rng.uniform(0, 2e-5)) if e.is_compute else e for e in events]


def without(events, rank, kind, mb):
    gone = [e for e in events if (e.rank, e.kind, e.microbatch) == (rank, kind, mb)]
    assert len(gone) == 1
    return [e for e in events if e is not gone[0]]


# ------------------------------------------------------------------------------------------ matching
def test_every_send_pairs_with_exactly_one_receive(afab):
    result = match(afab)
    sends = [e for e in afab if e.kind in SENDS]
    recvs = [e for e in afab if e.kind in RECVS]
    assert result.ok and str(result) == f"{len(sends)} messages matched"
    assert len(result.pairs) == len(sends) == len(recvs) == 2 * 4 * 3
    assert sorted(map(id, (s for s, _ in result.pairs))) == sorted(map(id, sends))
    assert sorted(map(id, (r for _, r in result.pairs))) == sorted(map(id, recvs))
    for send, recv in result.pairs:
        assert (send.rank, send.peer, send.microbatch) == (recv.peer, recv.rank, recv.microbatch)
        assert send.kind.split("_")[1] == recv.kind.split("_")[1]
    assert check_matching(afab) == result.pairs


def test_missing_receive_is_reported_with_rank_microbatch_and_op(afab):
    events = without(afab, 2, "recv_forward", 3)
    result = match(events)
    assert not result.ok and not result.orphan_recvs
    assert [(e.rank, e.kind, e.microbatch) for e in result.lost_sends] == [(1, "send_forward", 3)]
    assert result.problems() == ["rank 1: send_forward of micro-batch 3 to rank 2 has no matching "
                                 "recv_forward on rank 2"]
    with pytest.raises(UnmatchedMessages, match="rank 1: send_forward of micro-batch 3 to rank 2"):
        check_matching(events)
    assert len(match_messages(events)) == len(match_messages(afab)) - 1


def test_receive_without_send_is_reported_with_rank_microbatch_and_op(afab):
    events = without(afab, 3, "send_backward", 1)
    result = match(events)
    assert not result.ok and not result.lost_sends
    assert result.problems() == ["rank 2: recv_backward of micro-batch 1 from rank 3 has no matching "
                                 "send_backward on rank 3"]
    with pytest.raises(UnmatchedMessages) as info:
        check_matching(events)
    assert "rank 2: recv_backward of micro-batch 1 from rank 3" in str(info.value)


def test_both_kinds_of_unmatched_messages_are_all_listed(afab):
    events = without(without(afab, 0, "send_forward", 0), 0, "recv_backward", 2)
    with pytest.raises(UnmatchedMessages) as info:
        check_matching(events)
    text = str(info.value)
    assert "rank 1: recv_forward of micro-batch 0 from rank 0 has no matching send_forward on rank 0" in text
    assert "rank 1: send_backward of micro-batch 2 to rank 0 has no matching recv_backward on rank 0" in text


def test_repeated_messages_pair_in_order():
    def ev(rank, kind, peer, t):
        return Event(rank, kind, 0, peer, (2,), 16, t, t + 0.1)
    events = [ev(0, "send_forward", 1, 0.0), ev(0, "send_forward", 1, 1.0),
              ev(1, "recv_forward", 0, 0.05), ev(1, "recv_forward", 0, 1.05)]
    pairs = match_messages(events)
    assert [(s.t_start, r.t_start) for s, r in pairs] == [(0.0, 0.05), (1.0, 1.05)]


def test_chrome_trace_uses_the_same_matching(afab):
    assert chrome_trace.match_messages is match_messages
    trace = chrome_trace.to_chrome_trace(without(afab, 1, "recv_backward", 0))["traceEvents"]
    assert sum(t["ph"] == "s" for t in trace) == sum(t["ph"] == "f" for t in trace) == 2 * 4 * 3 - 1


# ------------------------------------------------------------------------------------------- clocks
def test_clock_alignment_puts_every_receive_after_its_send(afab):
    assert clock_offsets(match(afab).pairs, 4) == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}   # consistent: untouched
    skewed = shift(afab, {1: -5e-3, 3: +2e-3})       # rank 1 left the barrier late, rank 3 early
    assert any(r.t_end < s.t_start for s, r in match(skewed).pairs)
    offsets = clock_offsets(match(skewed).pairs, 4)
    fixed = shift(skewed, offsets)
    assert all(r.t_end >= s.t_start - 1e-12 for s, r in match(fixed).pairs)
    assert offsets[1] == pytest.approx(5e-3, abs=1e-3)
    tl = prepare(skewed, 4, 4)
    assert set(tl.offsets) >= {1} and min(e.t_start for e in tl.events) == 0
    assert "clocks aligned with the messages (rank 1 +" in tl.note


# -------------------------------------------------------------------------------------------- ideal
def test_ideal_afab_with_free_messages_has_the_theoretical_bubble():
    for p, m in [(4, 4), (3, 2), (2, 8), (1, 3)]:
        tl = prepare(ideal_events(p, m, FREE_LINKS), p, m, align=False)
        assert tl.bubble == pytest.approx(theoretical_bubble(p, m))
        assert tl.span == pytest.approx((m + p - 1) * (1e-3 + 2e-3))


def test_ideal_schedule_is_afab_in_logical_steps():
    events = ideal_events(4, 4, FREE_LINKS)
    assert text_grid.step_grid(events, 4).splitlines() == [
        "rank 0 | F0  F1  F2  F3  .   .   .   .   .   .   B0  B1  B2  B3",
        "rank 1 | .   F0  F1  F2  F3  .   .   .   .   B0  B1  B2  B3  .",
        "rank 2 | .   .   F0  F1  F2  F3  .   .   B0  B1  B2  B3  .   .",
        "rank 3 | .   .   .   F0  F1  F2  F3  B0  B1  B2  B3  .   .   ."]
    for r in range(4):
        mine = [e for e in events if e.rank == r and e.kind in COMPUTE]
        assert [e.kind[0] + str(e.microbatch) for e in mine] == ["f0", "f1", "f2", "f3", "b0", "b1", "b2", "b3"]
    assert match(events).ok


def test_ideal_latency_adds_two_trips_through_the_pipeline():
    p, m, latency = 4, 4, 0.25e-3
    events = ideal_events(p, m, replace(FREE_LINKS, latency_s=latency))
    span = max(e.t_end for e in events)
    assert span == pytest.approx((m + p - 1) * 3e-3 + 2 * (p - 1) * latency)
    slow = ideal_events(p, m, replace(FREE_LINKS, bandwidth_bytes_per_s=1e6), activation_bytes=4096)
    assert max(e.t_end for e in slow) > span        # every send now keeps its rank busy 4 ms
    assert all(e.bytes == 4096 for e in slow if not e.is_compute)


def test_ideal_uses_equal_compute_per_layer():
    events = ideal_events(3, 2, FREE_LINKS, stage_layers=[3, 2, 2])     # as a run of 7 layers records them
    fwd = {e.rank: e.duration for e in events if e.kind == "forward" and e.microbatch == 0}
    assert fwd == pytest.approx({0: 3e-3, 1: 2e-3, 2: 2e-3})


def test_calibrate_takes_the_measured_compute(afab):
    measured = [replace(e, t_end=e.t_start + (4e-3 if e.kind == "forward" else 6e-3)) if e.is_compute else e
                for e in afab]
    cost = calibrate(measured, 4, stage_layers=[2, 2, 2, 2])
    assert cost.forward_s_per_layer == pytest.approx(2e-3) and cost.backward_s_per_layer == pytest.approx(3e-3)
    assert cost.latency_s == CostModel().latency_s
    comm_only = [e for e in afab if not e.is_compute]          # what a Q7 run records
    zero = calibrate(comm_only, 4)
    assert zero.forward_s_per_layer == zero.backward_s_per_layer == 0
    events = ideal_events(4, 2, zero, activation_bytes=64)
    assert events and not any(e.is_compute for e in events) and match(events).ok


# ------------------------------------------------------------------------------------------ drawing
def test_static_figure_has_a_row_per_rank_and_the_bubble_in_the_title(afab):
    fig = static_figure(afab, 4, 4, title="q08: 4 stages, 4 micro-batches", activation_bytes=4096)
    measured, ideal = fig.axes
    assert [t.get_text() for t in measured.get_yticklabels()] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    assert measured.get_title(loc="left").startswith("measured: step ")
    assert " ms · bubble " in measured.get_title(loc="left")
    assert "theory (p-1)/(m+p-1) = (4-1)/(4+4-1) = 42.9%" in measured.get_title(loc="left")
    assert ideal.get_title(loc="left").startswith("ideal: step ")
    assert "time" in ideal.get_xlabel() and "(ms)" in ideal.get_xlabel()
    assert len([c for c in measured.texts if c.get_text() in ("F0", "B3")]) == 8      # labelled boxes
    assert sum(1 for c in measured.texts if c.get_text().startswith("sent ")) == 4
    assert fig._repr_png_().startswith(b"\x89PNG")


def test_static_figure_of_messages_only_and_of_nothing():
    comm = [e for e in ideal_events(4, 2, activation_bytes=64) if not e.is_compute]
    fig = static_figure(comm, 4, 2, with_ideal=False)
    assert "n/a" in fig.axes[0].get_title(loc="left")
    assert static_figure([], 2, 2)._repr_png_().startswith(b"\x89PNG")


def test_show_while_autograding_makes_a_figure_and_no_widget(afab, monkeypatch):
    from ipywidgets.widgets.widget import _instances as live_widgets
    from matplotlib.figure import Figure
    monkeypatch.setenv("NBGRADER_EXECUTION", "autograde")
    before = len(live_widgets)
    out = show(afab, 4, 4, title="autograde")
    assert isinstance(out, Figure) and len(live_widgets) == before


def test_widget_steps_through_events_and_toggles_to_ideal(afab, monkeypatch):
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    view = show(shift(afab, {2: 3e-3}), 4, 4, title="q08", activation_bytes=4096)
    n = len(afab)
    assert view.slider.max == view.play.max == n and view.slider.value == n     # opens on the whole run
    frames = {}
    for step in (1, 11, 31):                                                  # steps count from 1
        view.slider.value = step
        assert f'data-step="{step - 1}"' in view.frame.value and 'data-view="measured"' in view.frame.value
        assert f"event {step}/{n}" in view.info.value     # "event", not "step" (issue 55: step meant three things)
        frames[step] = view.frame.value
    assert len(set(frames.values())) == 3
    step = 1 + next(i for i, e in enumerate(view.view.events) if e.kind == "send_forward")
    view.slider.value = step
    e = view.view.events[step - 1]
    for text in ("send_forward", f"micro-batch {e.microbatch}", f"to rank {e.peer}", "shape (2, 16, 32)",
                 "4,096 bytes"):
        assert text in view.info.value
    assert "measured: <b>" in view.side.value and "42.9%" in view.side.value and "rank 3" in view.side.value
    assert "aligned" in view.side.value and "before aligning" in view.side.value   # rank 2's clock was off
    view.toggle.value = "ideal"
    m = len(view.views["ideal"].events)
    assert 'data-view="ideal"' in view.frame.value and view.slider.max == view.play.max == m
    assert view.slider.value == 1 + round((step - 1) / (n - 1) * (m - 1))


def test_timelines_share_message_size_and_shape(afab):
    measured, ideal = timelines(afab, 4, 4)
    assert {e.bytes for e in ideal.events if not e.is_compute} == {4096}
    assert {e.shape for e in ideal.events if not e.is_compute} == {(2, 16, 32)}
    assert "averages of the measured run" in ideal.note


def test_a_run_where_ranks_raised_says_so_above_its_timeline_not_that_every_rank_was_waiting():
    """Issue 41, item 3: q11's wrong-direction run (ranks 0-2 raised, rank 3 left waiting) read "stopped by the
    check: every rank was waiting" under a check that said rank 0 raised."""
    from types import SimpleNamespace

    from lab_src.views.saved import verdict
    stuck = SimpleNamespace(absent=False)
    errors = {r: {"type": "WrongDirection", "message": "a receive from rank 1"} for r in range(3)}
    errors[3] = {"type": "StoppedWaiting", "message": "stopped by the check"}
    out = SimpleNamespace(stuck=stuck, failure=None, errors=lambda: errors, case=SimpleNamespace(stages=4))
    assert verdict(out) == ("ranks 0, 1, 2 raised WrongDirection; the other ranks were left waiting until the "
                            "check stopped them")
    waiting = {r: {"type": "StoppedWaiting", "message": "stopped by the check"} for r in range(4)}
    out = SimpleNamespace(stuck=stuck, failure=None, errors=lambda: waiting, case=SimpleNamespace(stages=4))
    assert verdict(out).startswith("stopped by the check: every rank was waiting")


# ------------------------------------------------------------------------------------------ issue 55, item 3
def test_a_run_stopped_before_any_operation_ended_draws_where_each_rank_waited(monkeypatch):
    """q19's blocking ring (every rank still in its first send when the check stopped it) drew "No events were
    recorded in this run." and "run time: 0.0 ms" beside a side panel that promised red marks."""
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    waits = [Event(r, "send_forward" if r < 3 else "send_backward", None, (r + 1) % 4, None, 0, 0.001 * r,
                   0.36 + 0.001 * r) for r in range(4)]
    view = show([], 4, 1, compute_free="no compute recorded", waits=waits,
                verdict="stopped by the check: every rank was waiting")
    assert "No events were recorded" not in view.frame.value
    assert view.frame.value.count('class="pp-wait"') == 4 and "waits in a send to rank 1" in view.frame.value
    assert "No operation had ended when the run was stopped" in view.info.value
    assert "stopped after 363 ms" in view.side.value and "run time" not in view.side.value
    assert "In red: where each rank was left waiting" in view.side.value
    assert ">left waiting</text>" in view.frame.value and ">send</text>" not in view.frame.value   # none drawn
    # each wait on its own rank's row, one row apart
    import re

    from lab_src.views.svg import ROW_H
    middles = [float(y) + float(h) / 2 for y, h in re.findall(
        r'class="pp-wait" x="[^"]*" y="([^"]*)" width="[^"]*" height="([^"]*)"', view.frame.value)]
    assert [round(b - a, 1) for a, b in zip(middles, middles[1:])] == [ROW_H] * 3, middles


def _one_stage_grid():
    """2 data-parallel ranks of one stage: a forward and a backward each, then a ring's messages, rank 0's
    receive waiting long (q21's optimizer ring after a one-stage 1F1B step)."""
    ev = []
    for r in range(2):
        ev += [Event(r, "forward", 0, None, None, 0, 0.0, 0.010), Event(r, "backward", 0, None, None, 0, 0.010, 0.030)]
    ev += [Event(0, "send_forward", None, 1, (8,), 32, 0.030, 0.031), Event(1, "recv_forward", None, 0, (8,), 32, 0.030, 0.032),
           Event(1, "send_backward", None, 0, (8,), 32, 0.050, 0.051), Event(0, "recv_backward", None, 1, (8,), 32, 0.031, 0.052)]
    return ev


def test_a_run_of_one_stage_says_its_idle_time_and_no_pipeline_bubble(monkeypatch):
    """q21's one-stage run read "measured 63.6% / theory (p-1)/(m+p-1) = (1-1)/(2+1-1) = 0.0%": its idle time is
    its optimizer ring's receives, no pipeline's bubble."""
    from lab_src.topics.dp_pp.timeline import grid_figure, grid_timeline
    from lab_src.views.widget import TimelineWidget
    ev = _one_stage_grid()
    tl = grid_timeline(ev, 2, 1, 2)
    assert not tl.bubble_meant
    fig = grid_figure(ev, 2, 1, 2)
    title = fig.axes[0].get_title(loc="left")
    assert "(one stage: no pipeline bubble)" in title and "theory" not in title, title
    assert f"idle {tl.bubble:.1%} of the ranks' time, {tl.receive_share():.1%} in receives" in title
    assert 0 < tl.receive_share() < tl.bubble
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "idle" in legend and "idle (bubble)" not in legend
    side = TimelineWidget(tl, None).side.value
    assert "<b>Idle time</b>" in side and "theory" not in side and "(p-1)" not in side and "Bubble" not in side
    # two stages: a pipeline, its bubble beside its schedule's theory
    two = grid_timeline([Event(e.rank, e.kind, e.microbatch, e.peer, e.shape, e.bytes, e.t_start, e.t_end)
                         for e in ev], 1, 2, 2)
    assert two.bubble_meant and "theory (p-1)/(m+p-1) = (2-1)/(2+2-1)" in TimelineWidget(two, None).side.value


def _split(events):
    """`events` with each backward split into its I and W halves (q16's kinds)."""
    out = []
    for e in events:
        if e.kind == "backward":
            mid = e.t_start + 0.4 * (e.t_end - e.t_start)
            out += [replace(e, kind="backward_input", t_end=mid), replace(e, kind="backward_weight", t_start=mid)]
        else:
            out.append(e)
    return out


def test_a_zero_bubble_run_states_zb_h1s_formula_and_its_legend_only_its_kinds(monkeypatch):
    """q16's study timeline of a ZB-H1 run printed 1F1B's "theory (p-1)/(m+p-1) = 27.3%" beside "emulated compute:
    14.6%", and its legend listed "backward" where the run had only F, I and W."""
    from html import unescape

    from lab_src.views.bubble import split_box_times, zero_bubble_theory
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    events = _split(ideal_events(4, 8, FREE_LINKS, schedule="1f1b", activation_bytes=64))
    view = show(events, 4, 8, schedule="zbh1", emulate={})          # as the study draws it
    assert list(view.views) == ["measured", "emulated compute"]
    side = unescape(view.side.value)
    assert "ZB-H1 theory (p-1)(T_F+T_I-T_W) with the measured view's boxes = " in side
    assert f"{zero_bubble_theory(4, 8, *split_box_times(events)):.1%}" in side
    assert "(p-1)/(m+p-1)" not in side and f"= <b>{theoretical_bubble(4, 8):.1%}</b>" not in side
    view.toggle.value = "emulated compute"
    assert "with the emulated compute view's boxes" in unescape(view.side.value)
    legend = [t for t in ("forward", "backward", "I: input's gradient") if f">{t}</text>" in view.frame.value]
    assert legend == ["forward", "I: input's gradient"], legend
    figure = static_figure(events, 4, 8, schedule="zbh1", emulate={})
    names = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "backward" not in names and names[:3] == ["forward", "I: input's gradient", "W: weights' gradients"]
    # a run with a whole backward still names it
    plain = [t.get_text() for t in static_figure(ideal_events(2, 2, activation_bytes=64), 2, 2).legends[0].get_texts()]
    assert plain[:2] == ["forward", "backward"]
