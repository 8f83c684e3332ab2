"""The memory lane by kind (views/memory.py, pipeline/trace.py's Event.state): the sharding kinds record with every
event the bytes of the training state the rank holds (parameters kept, gathered copies, gradients, optimizer
state) beside its activations; the record travels in an event's row, and both drawings stack the kinds per rank.
Fast: synthetic events. The multi-process runs that fill it: tests/test_q21_sharded_adamw_step.py and
tests/test_q22_fsdp_layer.py."""
from __future__ import annotations

import json

from lab_src.pipeline.trace import STATE_KINDS, Event, Tracer


def _events():
    """Two ranks: a forward (activations up), a gather (a layer's copy alive), a backward (gradients), a step
    (optimizer state; gradients freed)."""
    out = []
    for r in range(2):
        out += [Event(r, "forward", 0, None, (2,), 8, 0.00, 0.01, 0, 1000, state=(4000, 0, 0, 0)),
                Event(r, "allgather_fsdp", None, None, (8,), 32, 0.01, 0.02, 0, 1000, group=(0, 1), lane=1,
                      state=(4000, 3000, 0, 0)),
                Event(r, "backward", 0, None, (2,), 8, 0.02, 0.03, 0, 0, state=(4000, 0, 4000 + 100 * r, 0)),
                Event(r, "send_forward", None, 1 - r, (8,), 32, 0.03, 0.04, 0, 0, state=(4000, 0, 0, 2000))]
    return out


def test_an_events_state_travels_in_its_row_and_rows_without_it_load_as_before():
    e = _events()[1]
    assert len(e.to_row()) == 13
    assert Event.from_row(json.loads(json.dumps(e.to_row()))) == e
    plain = Event(0, "forward", 1, None, (2, 3), 24, 0.5, 0.75, 0, 100)
    assert len(plain.to_row()) == 10 and Event.from_row(plain.to_row()).state is None
    assert Event.from_row(list(Event(1, "recv_forward", 0, 0, (2,), 8, 0, 1, lane=1).to_row())).lane == 1


def test_a_tracer_records_the_state_its_kind_measures_with_every_event():
    tracer = Tracer(0)
    held = {"grads": 0}
    tracer.state_memory = lambda: (400, 0, held["grads"], 0)
    with tracer.span("forward", 0):
        pass
    held["grads"] = 400
    with tracer.span("backward", 0):
        pass
    assert [e.state for e in tracer.events] == [(400, 0, 0, 0), (400, 0, 400, 0)]
    assert STATE_KINDS == ("parameters", "gathered", "gradients", "optimizer")


def test_the_lane_stacks_each_kind_and_names_each_ranks_peak():
    from lab_src.views import memory
    from lab_src.views.prepare import prepare
    tl = prepare(_events(), 2, 1, align=False)
    assert memory.has_state(tl)
    assert memory.kinds_held(tl.events) == ["parameters", "optimizer", "gradients", "gathered", "activations"]
    peaks = memory.state_peaks(tl.events, 2)
    assert peaks[1][0] == 8100 and peaks[1][1]["gradients"] == 4100          # the backward's end: params + grads
    # rank 0's first peak: its parameters, a gathered layer and a micro-batch's activations
    assert memory.describe_state(tl.events, 2)[0] == "rank 0: 7.8 KiB (parameters 3.9, gathered 2.9, activations 1.0)"
    svg = memory.svg_state_lane(tl, lambda t: t * 1e4, 0, 60, 400, cursor=0.025)
    assert svg.count("<polygon") >= 2 * 2 * 5                                 # ranks x (ghost, done) x kinds
    assert "gathered whole weights" in svg and memory.lane_height(tl) == 22 + 2 * memory.STATE_ROW


def test_both_drawings_show_the_lane_and_the_gathers_row_is_named():
    from lab_src.views import svg
    from lab_src.views.prepare import lane_labels, prepare
    from lab_src.views.static import figure
    tl = prepare(_events(), 2, 1, align=False)
    fig = figure([tl], "sharding")
    assert any("memory per rank, by kind" in ax.get_title(loc="left") for ax in fig.axes)
    assert "gathered whole weights" in svg.frame(tl, 3)
    assert lane_labels(tl.events) == {0: "FSDP", 1: "FSDP"}


def test_a_collectives_own_messages_are_drawn_as_its_bar():
    """q22's gathers run on the student's ring: the ring's messages, inside the gather's span in the same lane,
    are folded into its bar (no bars or arrows of their own); a message outside any collective is drawn."""
    from lab_src.views.prepare import folded_messages, prepare
    from lab_src.views.static import figure
    events = [Event(0, "allgather_fsdp", None, None, (8,), 32, 0.0, 0.02, group=(0, 1), lane=1),
              Event(1, "allgather_fsdp", None, None, (8,), 32, 0.0, 0.02, group=(0, 1), lane=1),
              Event(0, "send_forward", None, 1, (4,), 16, 0.005, 0.006, lane=1),
              Event(1, "recv_forward", None, 0, (4,), 16, 0.005, 0.007, lane=1),
              Event(0, "send_forward", None, 1, (4,), 16, 0.03, 0.031, lane=1),
              Event(1, "recv_forward", None, 0, (4,), 16, 0.03, 0.032, lane=1)]
    assert folded_messages(events) == set(events[2:4])
    tl = prepare(events, 2, 1, align=False)
    assert len(tl.matching.pairs) == 2 and len(tl.folded) == 2
    texts = [t.get_text() for ax in figure([tl]).axes for t in ax.texts]
    assert "sent 32 B" in texts and not any("in collectives" in t for t in texts)   # folded: its bytes are sent
