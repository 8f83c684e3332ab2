"""One scene for both drawings (issue 53): views/scene.py decides what a timeline panel shows and what its legend
says; static.py (matplotlib) and svg.py (the widget's frame) only paint it."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from html import unescape

import pytest

from lab_src.pipeline.trace import Event
from lab_src.views import scene as sc
from lab_src.views import svg
from lab_src.views.prepare import prepare
from lab_src.views.static import figure, legend_handles
from lab_src.views.timeline import ideal_events


def legend_words(frame: str, items) -> list[str]:
    labels = {i.label for i in items}
    return [t for t in (unescape(t) for t in re.findall(r"<text [^>]*>([^<]*)</text>", frame)) if t in labels]


def static_legend(fig) -> list[str]:
    return [t.get_text() for t in fig.legends[0].get_texts()]


def zero_bubble_run() -> list[Event]:
    """A 2-rank step with split backwards (I and W, the zero bubble's kinds) and a data-parallel all-reduce."""
    events = ideal_events(2, 2, activation_bytes=64)
    out = []
    for e in events:
        if e.kind == "backward":
            mid = (e.t_start + e.t_end) / 2
            out += [replace(e, kind="backward_input", t_end=mid), replace(e, kind="backward_weight", t_start=mid)]
        else:
            out.append(e)
    end = max(e.t_end for e in out)
    return out + [Event(r, "allreduce_dp", None, None, None, 512, end, end * 1.1, 0, group=(0, 1)) for r in range(2)]


RUNS = {
    "zero bubble + all-reduce": lambda: prepare(zero_bubble_run(), 2, 2, align=False),
    "interleaved chunks": lambda: prepare([replace(e, chunk=e.microbatch % 2) if e.is_compute else e
                                           for e in ideal_events(2, 4, activation_bytes=64)], 2, 4, align=False,
                                          chunks=2),
    "collectives alone": lambda: prepare([Event(r, "all_reduce", None, None, (2, 8), 64, 0.001 * r + s, 0.004 + s, 0,
                                                group=(0, 1)) for s in (0.0, 0.01) for r in range(2)], 2, 1,
                                         align=False),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_both_painters_paint_exactly_the_scenes_legend(name):
    tl = RUNS[name]()
    items = sc.legend_of([tl])
    want = [i.label for i in items]
    assert len(want) == len(set(want))
    assert static_legend(figure([tl])) == want
    frame = svg.frame(tl, 3)
    ET.fromstring(frame)
    assert legend_words(frame, items) == want
    # the widget's legend is the last texts of its frame, in the scene's order
    texts = [unescape(t) for t in re.findall(r"<text [^>]*>([^<]*)</text>", frame)]
    assert texts[-len(want):] == want
    # and the old entry points name the same list
    assert [h.get_label() for h in legend_handles(*_legend_args(tl))] == want
    collectives, chunks, unfinished, pipeline, messages = _legend_args(tl)
    old = svg.legend(0, 0, collectives, chunks, unfinished, pipeline=pipeline, messages=messages)
    assert [unescape(t) for t in re.findall(r"<text [^>]*>([^<]*)</text>", old)] == want


def _legend_args(tl):
    from lab_src.views.prepare import legend_kinds
    return legend_kinds(tl.events), tl.chunks, tl.unfinished, not tl.collectives_only, bool(tl.compute_free)


def test_the_legends_name_what_is_drawn_in_the_same_words():
    """The drift the scene ended: 'paler: later chunks' was the widget's only, the split backward's halves came
    after the collectives in the figure, and the widget wrote 'tied all-reduce' for 'tied-embedding all-reduce'."""
    chunks = [i.label for i in sc.legend_of([RUNS["interleaved chunks"]()])]
    assert "paler: later chunks (F3c1: micro-batch 3, chunk 1)" in chunks
    zb = [i.label for i in sc.legend_of([RUNS["zero bubble + all-reduce"]()])]
    # only the kinds drawn: the split run has no whole backward (issue 55: q16's legend listed one)
    assert zb[:3] == ["forward", "I: input's gradient", "W: weights' gradients"] and "backward" not in zb
    assert zb[-1] == "data-parallel all-reduce" and "idle (bubble)" in zb
    assert [i.label for i in sc.legend_of([RUNS["collectives alone"]()])] == ["all-reduce (torch.distributed)"]
    tied = sc.legend(("allreduce_tied",))
    assert "tied-embedding all-reduce" in [i.label for i in tied]
    frame = svg.paint(sc.Scene(1, 1.0, 1.0, "", "black", [sc.RowLabel(0, "rank 0")], legend=tied), width=860)
    assert ">tied-embedding all-reduce</text>" in frame
    for _, (x, line) in zip(tied, svg._layout(tied, svg.LEFT, 852)):   # wrapped to fit the frame
        assert x >= svg.LEFT


def test_an_unfinished_run_says_so_first_in_both():
    events = ideal_events(2, 2, activation_bytes=64)
    wait = Event(1, "recv_forward", 0, 0, (8,), 64, 0.002, 0.5, 0)
    tl = prepare(events, 2, 2, align=False, waits=[wait], verdict="rank 1 timed out")
    want = [i.label for i in sc.legend_of([tl])]
    assert want[0] == "left waiting" and "idle (bubble)" in want        # the hatched idle is drawn: named
    assert static_legend(figure([tl])) == want
    assert legend_words(svg.frame(tl), sc.legend_of([tl])) == want


def test_a_feature_of_the_scene_is_painted_by_both():
    """Each primitive the scene holds shows in the figure and in the frame: here a marked event, a lane's
    name, a rank's bytes, a collective's join and a compute box's label."""
    events = ideal_events(2, 2, activation_bytes=64)
    end = max(e.t_end for e in events)
    events += [Event(r, "allreduce_dp", None, None, None, 512, end, end * 1.5, 0, group=(0, 1)) for r in range(2)]
    events += [Event(0, "send_forward", None, 1, (8,), 32, end * 0.2, end * 0.25, lane=1),
               Event(1, "recv_forward", None, 0, (8,), 32, end * 0.2, end * 0.26, lane=1)]
    marked = next(e for e in events if e.is_send and not e.lane)
    tl = prepare(events, 2, 2, align=False, marked=[(marked, "held back here")])
    s = sc.scene(tl)
    assert s.marks and s.joins and s.tallies and any(r.lane for r in s.rows) and any(b.label for b in s.boxes)
    fig = figure([tl])
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    frame = svg.frame(tl)
    for words in ("held back here", "its lane 1", s.tallies[0].text().split("\n")[0]):
        assert any(words in t for t in texts), words
        assert f">{words}</text>" in frame or f"> {words}</text>" in frame, words
    label = next(b.label for b in s.boxes if b.label)
    assert label in texts and f">{label}</text>" in frame
    dotted = [line for line in ax.lines if line.get_linestyle() == ":"]
    assert len(dotted) == len(s.joins) and frame.count('stroke-dasharray="3,2"/>') >= len(s.joins)
    # a scene that gains a primitive is painted by both, with no change to either painter's choices
    s.marks.append(sc.Mark(0.0, end * 0.1, 1, "added to the scene"))
    from matplotlib.figure import Figure

    from lab_src.views.static import paint
    ax2 = Figure().subplots()
    paint(ax2, s)
    assert "added to the scene" in " ".join(t.get_text() for t in ax2.texts)
    assert ">added to the scene</text>" in svg.paint(s)


def test_the_widgets_frame_tallies_collectives_as_the_figure_does():
    tl = RUNS["collectives alone"]()
    s = sc.scene(tl)
    assert [t.text() for t in s.tallies] == ["128 B all-reduced", "128 B all-reduced"]
    assert "128 B all-reduced" in [t.get_text() for t in figure([tl]).axes[0].texts]
    assert ">128 B all-reduced</text>" in svg.frame(tl)
    assert ">64 B all-reduced</text>" in svg.frame(tl, 1)          # so far, at the cursor


def test_a_ring_of_messages_names_its_calls_and_its_wrap_around_in_both():
    """Issue 55, item 3: q19's timeline held 8 calls of the ring with nothing to tell them apart, and its arrows to a
    lower rank (the wrap-around, last rank to first, drawn in another colour) were not in the legend."""
    n, events, sections = 4, [], []
    for k, (words, nbytes) in enumerate([("fc1: 200,960", 200_960), ("1", 4)]):
        t0, idx = 0.1 * k, []
        for step in range(2 * (n - 1)):
            t = t0 + 0.01 * step
            for r in range(n):
                right, left = (r + 1) % n, (r - 1) % n
                idx += [len(events), len(events) + 1]
                events += [Event(r, "send_forward" if right > r else "send_backward", None, right, (nbytes // 4,),
                                 nbytes, t, t + 0.004),
                           Event(r, "recv_forward" if left < r else "recv_backward", None, left, (nbytes // 4,),
                                 nbytes, t, t + 0.006)]
        sections.append((words, idx))
    tl = prepare(events, n, 1, align=False, sections=sections)
    tl.compute_free = "no compute recorded"
    s = sc.scene(tl)
    assert [(c.words, round(c.t0, 6)) for c in s.sections] == [("fc1: 200,960", 0.0), ("1", 0.1)]
    assert s.title.startswith("measured: run ") and "step" not in s.title
    wrap = "message to a lower rank (the ring's wrap-around: last rank to first)"
    assert [i.label for i in s.legend][-2:] == ["message to a higher rank: send → receive", wrap]
    fig = figure([tl])
    assert {"fc1: 200,960", "1"} <= {t.get_text() for t in fig.axes[0].texts}
    assert static_legend(fig)[-1] == wrap and fig.axes[0].get_xlabel() == "time since the run started (ms)"
    frame = svg.frame(tl)
    ET.fromstring(frame)
    assert frame.count('class="pp-section"') == 2 and ">fc1: 200,960</text>" in frame and f">{wrap}</text>" in frame
    # a ring of messages to higher ranks only names no wrap-around
    down = [e for e in events if e.kind.endswith("forward")]
    assert wrap not in [i.label for i in sc.legend_of([prepare(down, n, 1, align=False)])]
