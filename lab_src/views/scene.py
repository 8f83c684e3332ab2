"""One timeline panel as a scene: everything both drawings show, decided once.

`scene(tl)` turns a prepared run (prepare.Timeline) into primitives on a time axis in seconds and a row axis
in rows from the top (rank r's middle at r, a lane's thin row LANE_STEP under it): what is drawn, where, in
which colour, with which words, and the legend that names it. The two painters only paint primitives:

    static.py   each primitive as matplotlib calls (the figure: autograding, feedback, docs)
    svg.py      each primitive as SVG elements (one frame of the widget's animation)

A feature of the timeline is added here, once; a painter is told how to paint a new kind of primitive. What
stays a painter's own is how a primitive looks in its medium: font metrics (whether a label fits its box),
tick marks, and in the animation, how a primitive shows before the cursor reaches it (`reveal`).

    Span     what the primitives drawn from a time to a time on a row share
    Shade    hatched idle time of a rank's row (the bubble)
    Box      a filled span: a compute box (labelled "F3"), a message's bar, a collective's thicker bar
    Arrow    a message from its send to its receive; `lost`: a send no receive took (dashed, ending in ✕)
    Join     the line joining a collective's members once the last is done
    Wait     where a run that did not finish left a rank waiting (red, dashed), with what it waited in
    Cross    where a rank's part ended in an exception (✕ and what it raised)
    Mark     an event the run points out (outlined, words above it)
    Section  a part of the run named above the ranks (q19: one call of the ring, its tensor's length)
    RowLabel a rank's row: "rank 2", a second line ("dp 1, pp 0"), its lane row's name
    Tally    the bytes a rank sent (and reduced in collectives), written at the row's right
    LegendItem  what a colour or a line means; `legend(...)` is the one list both drawings show
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab_src.pipeline.trace import Event
from lab_src.views.prepare import (BOX_LABELS, COLLECTIVE_LABELS, COLORS, LANE_BAR, LANE_RING, LANE_RING_LABEL,
                                   MESSAGE_PHASES, Timeline, box_color, box_label, collective_calls,
                                   describe, describe_wait, lane_ring, legend_kinds, row_of, wait_label)
from lab_src.views.prepare import LANE_STEP  # noqa: F401 (the painters' sc.LANE_STEP: a lane row's offset)

# heights, in rows
BOX = 0.65          # a compute box, and the idle (hatched) time behind it
BAR = 0.22          # a send's or a receive's bar
COLLECTIVE = 0.42   # a collective's bar
WAIT = 0.8 * BOX    # where a rank was left waiting
MARK = 2.4 * BAR    # the outline of a marked event
MIN_SPAN = 0.002    # the narrowest bar, as a share of the time axis (a message of no duration still shows)

ARROW_GREY = "#555"     # the legend's sample of a message's arrow (the arrows take their phase's colour)


# ---- the legend ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LegendItem:
    label: str
    swatch: str             # "box" (a compute box's colour), "bar" (a thin bar's), "idle" (hatched), "wait", "arrow"
    colour: str = ""


def legend(collectives: tuple = (), chunks: int = 1, unfinished: bool = False, pipeline: bool = True,
           messages: bool = False, bubble: bool = True) -> list[LegendItem]:
    """What the colours mean, in the order both drawings list it. `collectives`: the kinds drawn, of those a legend
    names only when they are (legend_kinds: the compute boxes, collectives, a lane's ring, the messages' phases);
    `pipeline=False` for a run of collectives alone (no boxes, messages or bubble), `messages` for a run of
    messages alone (q19's ring: no boxes or bubble); `bubble=False` where the hatched idle time is no pipeline's
    bubble (a run of one stage)."""
    items = [LegendItem("left waiting", "wait", COLORS["wait"])] if unfinished else []
    message_items = [LegendItem("send", "bar", COLORS["send"]), LegendItem("receive (waiting)", "bar", COLORS["recv"])]
    arrow = [LegendItem("message: send → receive", "arrow", ARROW_GREY)]
    named = [LegendItem(COLLECTIVE_LABELS[k], "bar", COLORS[k]) for k in COLLECTIVE_LABELS if k in collectives]
    if LANE_RING in collectives:
        named.append(LegendItem(LANE_RING_LABEL, "bar", COLORS[LANE_RING]))
    if messages:        # the arrows take their direction's colour: down the ring, and its wrap-around back up
        if not any(k in collectives for k in MESSAGE_PHASES.values()):
            # no message ended (a run stopped in its first sends: its waits alone), or a run of collectives alone
            # without compute (q25's all-to-alls and all-reduces): those it drew
            return items + named
        arrows = [LegendItem("message to a higher rank: send → receive", "arrow", COLORS["forward"])]
        if MESSAGE_PHASES["backward"] in collectives:
            arrows.append(LegendItem("message to a lower rank (the ring's wrap-around: last rank to first)", "arrow",
                                     COLORS["backward"]))
        return items + message_items + arrows
    if not pipeline:
        return items + named
    computed = [k for k in ("forward", "backward", *BOX_LABELS) if k in collectives]
    # the boxes drawn; a run with none (messages alone) names the phases its arrows are coloured by
    shown = computed or [k for k in ("forward", "backward") if MESSAGE_PHASES[k] in collectives]
    items += [LegendItem(k, "box", COLORS[k]) for k in ("forward", "backward") if k in shown]
    items += [LegendItem(BOX_LABELS[k], "box", COLORS[k]) for k in BOX_LABELS if k in shown]
    if chunks > 1:      # the palest forward: the last chunk
        palest = Event(0, "forward", 0, None, None, 0, 0.0, 0.0, chunks - 1)
        items.append(LegendItem("paler: later chunks (F3c1: micro-batch 3, chunk 1)", "box",
                                box_color(palest, chunks)))
    idle = "idle (bubble)" if bubble else "idle"
    return items + message_items + [LegendItem(idle, "idle", COLORS["idle"])] + arrow + named


def legend_of(timelines: list[Timeline]) -> list[LegendItem]:
    """The legend of panels drawn together (the static figure's; the widget's frame has one panel)."""
    return legend(legend_kinds(e for tl in timelines for e in tl.events), timelines[0].chunks,
                  any(tl.unfinished for tl in timelines), not all(tl.collectives_only for tl in timelines),
                  bool(timelines[0].compute_free), any(tl.pipeline_p > 1 for tl in timelines))


# ---- the panel ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Span:
    """Something drawn from t0 to t1 (s) on a row (its middle, in rows from the top)."""
    t0: float
    t1: float
    row: float


@dataclass(frozen=True)
class Shade(Span):
    height: float = BOX


@dataclass(frozen=True)
class Box(Span):
    height: float
    colour: str
    label: str = ""         # written inside, where it fits (a compute box's "F3")
    label_row: float = 0.0  # the row the label is written on
    edge: bool = False      # a thin white edge, so that neighbouring boxes stay apart
    tip: str = ""           # what hovering it says
    event: Event | None = None   # the event it draws (the animation outlines the one that just ended)


@dataclass(frozen=True)
class Arrow:
    t0: float
    row0: float
    t1: float
    row1: float
    colour: str
    phase: str = ""             # forward or backward: the arrow head's colour
    pair: tuple | None = None   # (send, receive): the animation draws it bold as either ends
    lost: bool = False          # a send no receive took: dashed, ending in ✕
    tip: str = ""


@dataclass(frozen=True)
class Join:
    t: float
    row0: float
    row1: float
    colour: str


@dataclass(frozen=True)
class Wait(Span):           # t1: where the wait is drawn to (the axis's end where it went on past it)
    label: str              # "waits in recv_forward(mb=2) from rank 0"
    until: str = ""         # "until stopped at 900 ms »", where the wait went on past the axis
    tip: str = ""


@dataclass(frozen=True)
class Cross:
    t: float
    row: float
    words: str
    tip: str = ""


@dataclass(frozen=True)
class Mark(Span):
    words: str
    height: float = MARK


@dataclass(frozen=True)
class Section:
    """A part of the run, named above the ranks from t0 to t1 (q19: one call of the ring)."""
    t0: float
    t1: float
    words: str


@dataclass(frozen=True)
class RowLabel:
    row: float
    text: str                   # "rank 2"
    note: str = ""              # a second line: "dp 1, pp 0"
    lane: str = ""              # the name of its lane row (LANE_STEP under it), if it has one


@dataclass(frozen=True)
class Tally:
    """The bytes a rank sent (each with when its send ended) and those it moved in collectives."""
    row: float
    sent: tuple = ()            # ((t_end, bytes), ...)
    reduced: tuple = ()         # ((t_end, bytes), ...)
    how: str = "all-reduced"    # or "in collectives"
    collectives_only: bool = False

    def text(self, until: float = float("inf")) -> str:
        """What it says at time `until` (the animation's cursor): 'sent 1,024 B' and '+ 512 B all-reduced'
        on a second line."""
        sent = sum(n for t, n in self.sent if t <= until)
        reduced = sum(n for t, n in self.reduced if t <= until)
        if self.collectives_only:
            return f"{reduced:,} B {self.how}"
        return f"sent {sent:,} B" + (f"\n+ {reduced:,} B {self.how}" if self.reduced else "")


@dataclass
class Scene:
    p: int
    t_max: float                # the end of the time axis (s)
    span: float                 # the end of the step (s)
    title: str
    title_colour: str
    rows: list[RowLabel]
    shades: list[Shade] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    joins: list[Join] = field(default_factory=list)
    waits: list[Wait] = field(default_factory=list)
    crosses: list[Cross] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    tallies: list[Tally] = field(default_factory=list)
    legend: list[LegendItem] = field(default_factory=list)


def scene(tl: Timeline, t_max: float | None = None) -> Scene:
    """The panel of `tl`; the axis ends at `t_max` seconds (default: the end of the step, and for a run that
    did not finish a little more, for where its ranks were left waiting)."""
    t_max = t_max or tl.drawn_until or 1e-3
    least = MIN_SPAN * t_max
    # a run of messages alone is no training step: its span is the run's
    title = f"{tl.kind}: {'run' if tl.compute_free else 'step'} {tl.span * 1e3:.1f} ms · {tl.bubble_text()}"
    if tl.unfinished:
        title = f"{tl.kind}: this run did not finish" + (f": {tl.verdict}" if tl.verdict else "")
    lanes = tl.lanes
    s = Scene(tl.p, t_max, tl.span, title + (f"\n{tl.kind}: {tl.note}" if tl.note else ""),
              COLORS["wait"] if tl.unfinished else "black",
              [RowLabel(r, f"rank {r}", tl.row_notes[r] if r < len(tl.row_notes) else "", lanes.get(r, ""))
               for r in range(tl.p)], legend=legend_of([tl]))
    if not (tl.collectives_only or tl.compute_free):    # the step is idle where nothing is drawn over it (a run of
        s.shades = [Shade(0.0, tl.span, r) for r in range(tl.p)]   # collectives alone: between them a rank computes)
    for e in tl.events:
        if e in tl.folded:
            continue
        tip = describe(e, tl.arrow_of(e), tl.chunks)
        if e.is_compute:
            s.boxes.append(Box(e.t_start, e.t_end, e.rank, BOX, box_color(e, tl.chunks), box_label(e, tl.chunks),
                               e.rank, edge=True, tip=tip, event=e))
        else:
            height = (COLLECTIVE if e.is_collective else BAR) * (LANE_BAR if e.lane else 1)
            colour = (COLORS[e.kind] if e.is_collective else COLORS[LANE_RING] if lane_ring(e, tl.folded)
                      else COLORS["send" if e.is_send else "recv"])
            s.boxes.append(Box(e.t_start, max(e.t_end, e.t_start + least), row_of(e), height, colour, tip=tip,
                               event=e))
    for send, recv in tl.matching.pairs:           # from the start of each send to the end of its receive
        if send in tl.folded or recv in tl.folded:
            continue
        down = 1 if recv.rank > send.rank else -1
        ring = lane_ring(send, tl.folded)           # q20's ring: the data-parallel all-reduce's colour
        s.arrows.append(Arrow(send.t_start, row_of(send) + down * BAR / 2, recv.t_end, row_of(recv) - down * BAR / 2,
                              COLORS[LANE_RING] if ring else COLORS[send.phase], LANE_RING if ring else send.phase,
                              (send, recv)))
    for kind, group, members in collective_calls(tl.events):   # each collective joins its members once all are done
        if len(group) > 1:
            s.joins.append(Join(max(e.t_end for e in members), min(group), max(group), COLORS[kind]))
    _unfinished(tl, s, t_max)
    s.marks = [Mark(e.t_start, max(e.t_end, e.t_start + least), row_of(e), words) for e, words in tl.marked]
    s.sections = [Section(t0, t1, words) for words, t0, t1 in tl.sections]
    s.tallies = _tallies(tl)
    return s


def _unfinished(tl: Timeline, s: Scene, t_max: float) -> None:
    """What a run that did not finish left: each rank's last wait (to where the run was stopped or to the edge),
    sends that no receive took, and where a rank's part ended in an exception."""
    for w in tl.waits:
        until = f"until stopped at {w.t_end * 1e3:.0f} ms »" if w.t_end > t_max else ""
        s.waits.append(Wait(w.t_start, min(w.t_end, t_max), w.rank, wait_label(w, tl.chunks), until,
                            describe_wait(w)))
    for send in tl.matching.lost_sends:
        down = 1 if send.peer > send.rank else -1
        s.arrows.append(Arrow(send.t_start, send.rank + down * BAR / 2, min(send.t_start + 0.05 * t_max, t_max * 0.99),
                              send.peer - down * BOX / 2, COLORS["wait"], lost=True,
                              tip=f"{describe(send, None)}: no receive took it"))
    s.crosses = [Cross(min(t, t_max), rank, what, f"rank {rank} {what} here") for rank, t, what in tl.ends]


def _tallies(tl: Timeline) -> list[Tally]:
    """Each rank's bytes; none for a model's step (no bytes at all). A collective whose messages were recorded
    (q22's, on the student's ring) is in the bytes sent already."""
    folding = {e.rank for e in tl.folded}
    sent = {r: tuple((e.t_end, e.bytes) for e in tl.events if e.rank == r and e.is_send and e.bytes)
            for r in range(tl.p)}
    reduced = {r: tuple((e.t_end, e.bytes) for e in tl.events if e.rank == r and e.is_collective and e.bytes)
               if r not in folding else () for r in range(tl.p)}
    if not any(sent.values()) and not any(reduced.values()):
        return []
    how = ("all-reduced" if all(e.kind in ("all_reduce", "allreduce_dp", "allreduce_tied")
                                for e in tl.events if e.is_collective)
           else "in collectives")     # q22's gathers and reduce-scatters
    return [Tally(r, sent[r], reduced[r], how, tl.collectives_only) for r in range(tl.p)]
