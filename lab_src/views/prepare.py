"""What both drawings (the static figure and the animated widget) need from one run's events."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from lab_src import topics
from lab_src.views.bubble import (bytes_sent, measured_bubble, split_box_times, theoretical_bubble, theory_text,
                                  zero_bubble_text, zero_bubble_theory)
from lab_src.pipeline.trace import SENDS, Event, op_text
from lab_src.views.clocks import clock_offsets, shift
from lab_src.pipeline.matching import Matching, match

COLORS = {"forward": "#4c78a8", "backward": "#f58518", "send": "#54a24b", "recv": "#9e9e9e",
          "idle": "#f1f1f1", "cursor": "#d62728", "wait": "#d62728",
          **{e.name: e.colour for e in topics.event_kinds()}}
# what a legend calls the kinds the topics declare: collectives, and compute boxes of their own (zero bubble's
# split backward, each half in its own colour), named only when drawn
COLLECTIVE_LABELS = {e.name: e.label for e in topics.event_kinds() if e.collective}
BOX_LABELS = {e.name: e.label for e in topics.event_kinds() if not e.collective}
LANE_LABELS = {e.name: e.lane_label for e in topics.event_kinds() if e.lane_label}


# what a legend calls a rank's lane messages that no collective spans (q20's reducing thread runs the student's q19
# ring there: the data-parallel all-reduce of a bucket), drawn in the data-parallel all-reduce's colour
LANE_RING = "lane_ring"
LANE_RING_LABEL = "data-parallel all-reduce: your ring's messages (lane 1)"
COLORS[LANE_RING] = COLORS.get("allreduce_dp", "#9467bd")
# the phases of a run's messages, for a legend whose arrows take their phase's colour and no box names it
MESSAGE_PHASES = {"forward": "msg_forward", "backward": "msg_backward"}


def legend_kinds(events) -> tuple:
    """The kinds of a run's events that the legend names only when they are drawn: the compute boxes (forward,
    backward, a split backward's halves), collectives, a lane's ring (LANE_RING), and the phases of the messages
    (MESSAGE_PHASES: the arrows' colours)."""
    events = list(events)
    folded = folded_messages(events)
    kinds = {e.kind for e in events if e.is_collective or e.is_compute}
    kinds |= {MESSAGE_PHASES[e.phase] for e in events if (e.is_send or e.is_recv) and e.phase in MESSAGE_PHASES}
    if any(lane_ring(e, folded) for e in events):
        kinds.add(LANE_RING)
    return tuple(sorted(kinds))


def lane_ring(e: Event, folded=frozenset()) -> bool:
    """A message of a rank's lane that no collective of its lane spans (`folded`): q20's ring, run by the rank's
    reducing thread; drawn as the data-parallel all-reduce it is."""
    return bool(e.lane) and (e.is_send or e.is_recv) and e not in folded


def box_color(e: Event, chunks: int = 1) -> str:
    """A compute box's colour: forward blue, backward orange (split: I dark orange, W gold); with several chunks per rank, chunk 0 in
    the full colour and each later chunk paler, so that the chunks can be told apart."""
    base = COLORS.get(e.kind) or COLORS[e.phase]
    if chunks <= 1 or not e.chunk:
        return base
    mix = 0.6 * e.chunk / (chunks - 1)          # the last chunk 60 % of the way to white
    rgb = [int(base[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def box_label(e: Event, chunks: int = 1) -> str:
    """'F3' (forward of micro-batch 3); 'F3c1' on chunk 1 where ranks hold several chunks."""
    return f"{e.op.letter}{e.microbatch}" + (f"c{e.chunk}" if chunks > 1 else "")


# A rank's other lanes (threads: pipeline/trace.py Tracer.lane, q20's reducing thread) are drawn in a thin row
# under its own, this far below its middle, in rows
LANE_STEP = 0.42


LANE_BAR = 0.55     # a lane's bars, as a share of the height of its rank's


def row_of(e: Event) -> float:
    """Where an event is drawn, in rows from the top: its rank's row, or a lane's thin row under it."""
    return e.rank + (LANE_STEP if e.lane else 0.0)


def lane_labels(events: list[Event]) -> dict[int, str]:
    """What names each rank's lane row at its left ("its lane 1"), for the ranks that have one."""
    lanes: dict[int, set] = {}
    kinds: dict[int, set] = {}
    for e in events:
        if e.lane:
            lanes.setdefault(e.rank, set()).add(e.lane)
            kinds.setdefault(e.rank, set()).add(e.kind)
    out = {}
    for r, ls in lanes.items():
        named = sorted({LANE_LABELS.get(k) for k in kinds[r]} - {None})
        out[r] = (", ".join(named) if named and all(k in LANE_LABELS for k in kinds[r])
                  else f"its lane{'s' if len(ls) > 1 else ''} {', '.join(map(str, sorted(ls)))}")
    return out


def folded_messages(events: list[Event]) -> set[Event]:
    """The lane messages a collective of the same rank and lane spans (q22's gathers and reduce-scatters, run on
    the student's ring): the collective's bar stands for them, so the drawings draw neither their bars nor their
    arrows; their bytes still count."""
    spans: dict[tuple, list] = {}
    for e in events:
        if e.lane and e.is_collective:
            spans.setdefault((e.rank, e.lane), []).append((e.t_start, e.t_end))
    return {e for e in events if e.lane and (e.is_send or e.is_recv)
            and any(a <= e.t_start and e.t_end <= b for a, b in spans.get((e.rank, e.lane), ()))}


@dataclass
class Timeline:
    """A run ready to draw: times in seconds from the step's start, every rank on one clock."""
    events: list[Event]                 # in the order they finished: the steps of the animation
    p: int
    m: int
    matching: Matching
    offsets: dict[int, float] = field(default_factory=dict)   # clock shift applied to each rank (s)
    kind: str = "measured"              # or "ideal"
    note: str = ""                      # how the events were made (the ideal view's cost model)
    raw_bubble: float | None = None     # the bubble before the clocks were aligned (what the check printed)
    chunks: int = 1                     # model chunks per rank (v of an interleaved schedule)
    # a run that did not finish: the operations ranks were left in (from their start to when the rank
    # gave up or was stopped), and where a rank's part ended in an exception: (rank, time, what)
    waits: list[Event] = field(default_factory=list)
    ends: list[tuple[int, float, str]] = field(default_factory=list)
    verdict: str = ""                   # why the run did not finish, in one line
    row_notes: list[str] = field(default_factory=list)   # a second line under each rank's label ("dp 1, pp 1")
    hide_bubble: bool = False           # a figure above a prediction of the bubble does not give it away
    # a run of messages with no schedule and no compute recorded (q19's ring: between its messages a rank adds
    # or copies a chunk): nothing between the bars is a bubble; what is there instead
    compute_free: str = ""
    # events to point out, each with what to say of it (q19's network study: the message the emulated network
    # held back): outlined in red, the words beside them
    marked: list[tuple[Event, str]] = field(default_factory=list)
    # parts of the run to name above it, (words, start, end) in seconds: q19's calls of the ring, one per length
    sections: list[tuple[str, float, float]] = field(default_factory=list)

    @functools.cached_property
    def folded(self) -> set[Event]:
        """Messages drawn as part of the collective that spans them (folded_messages)."""
        return folded_messages(self.events)

    @functools.cached_property
    def lanes(self) -> dict[int, str]:
        """What names each rank's lane row (lane_labels), of the events drawn: folded messages are not."""
        return lane_labels([e for e in self.events if e not in self.folded])

    @property
    def unfinished(self) -> bool:
        return bool(self.waits or self.ends or self.matching.lost_sends)

    @property
    def stopped_at(self) -> float:
        """When the last rank gave up (for an unfinished run), else the end of the step."""
        return max([self.span, *(w.t_end for w in self.waits), *(t for _, t, _ in self.ends)])

    @property
    def drawn_until(self) -> float:
        """The end of the time axis: the step, and for an unfinished run a little room after its last
        event for the waits that go on (drawn to the edge: they may have lasted much longer)."""
        if not self.unfinished:
            return self.span
        last = max([self.span, *(w.t_start for w in self.waits), *(t for _, t, _ in self.ends)])
        return min(self.stopped_at, last * 1.25 + 1e-4) if self.stopped_at > last else last * 1.05 + 1e-4

    @property
    def span(self) -> float:
        return max((e.t_end for e in self.events), default=0.0)

    @property
    def collectives_only(self) -> bool:
        """Only collectives were recorded (a tensor-parallel run: its compute is not recorded), so the time
        between two bars is the rank's compute, not a bubble: nothing is drawn as idle there."""
        return bool(self.events) and all(e.is_collective for e in self.events)

    @property
    def has_compute(self) -> bool:
        return any(e.is_compute for e in self.events)

    @property
    def bubble(self) -> float | None:
        """Idle share of the step: 1 - compute time / (p * span). None without compute boxes."""
        if not self.has_compute or self.span <= 0:
            return None
        busy = sum(e.duration for e in self.events if e.is_compute)
        return max(0.0, 1.0 - busy / (self.p * self.span))

    @property
    def theory(self) -> float:
        return theoretical_bubble(self.p, self.m, self.chunks)

    @property
    def pipeline_p(self) -> int:
        """The stages of one pipeline (a grid's rows are several: dp_pp/timeline.py GridTimeline)."""
        return self.p

    @property
    def bubble_meant(self) -> bool:
        """Whether the idle time is a pipeline's bubble: compute boxes on a pipeline of two stages or more. A run of
        one stage (q21's data-parallel ranks) idles only where it waits for messages (its optimizer's ring)."""
        return self.has_compute and self.pipeline_p > 1 and not self.compute_free

    def theory_words(self) -> tuple[str, float]:
        """(formula, value) of the schedule that ran: ZB-H1's with this view's own F, I and W boxes where the
        backward is split (q16), else (p-1)/(m+p-1), or (p-1)/(v·m+p-1) with v chunks per rank."""
        times = split_box_times(self.events)
        if times is not None:
            return ("ZB-H1 theory (p-1)(T_F+T_I-T_W) with these boxes",
                    zero_bubble_theory(self.pipeline_p, self.m, *times))
        return theory_text(self.pipeline_p, self.m, self.chunks).rsplit(" = ", 1)[0], self.theory

    def receive_share(self) -> float | None:
        """The share of the ranks' time spent in receives (each rank's receive bars, overlaps counted once)."""
        if self.span <= 0:
            return None
        total = 0.0
        for r in range(self.p):
            end = 0.0
            for e in sorted((e for e in self.events if e.rank == r and e.is_recv and not e.lane),
                            key=lambda e: e.t_start):
                total += max(0.0, e.t_end - max(e.t_start, end))
                end = max(end, e.t_end)
        return total / (self.p * self.span)

    def idle_text(self) -> str:
        """What the idle time of a run that is no pipeline is: 'idle 63.6% of the ranks' time, 58.0% in receives
        (one stage: no pipeline bubble)'."""
        got = "n/a" if self.bubble is None else f"{self.bubble:.1%}"
        recv = self.receive_share()
        return (f"idle {got} of the ranks' time" + (f", {recv:.1%} in receives" if recv else "")
                + " (one stage: no pipeline bubble)")

    def bytes_sent(self) -> dict[int, int]:
        return bytes_sent(self.events, self.p)

    def bubble_text(self) -> str:
        if self.compute_free:
            return self.compute_free
        if self.hide_bubble:
            return "bubble: yours to predict below"
        if self.has_compute and not self.bubble_meant:
            return self.idle_text()
        got = "n/a (no forward/backward recorded)" if self.bubble is None else f"{self.bubble:.1%}"
        return f"bubble {got} vs {zero_bubble_text(self.events, self.p, self.m) or theory_text(self.p, self.m, self.chunks)}"

    def arrow_of(self, e: Event) -> tuple[Event, Event] | None:
        """The (send, receive) pair that `e` belongs to, if it is a matched message."""
        for pair in self.matching.pairs:
            if e in pair:
                return pair
        return None


def prepare(events: list[Event], p: int, m: int, *, kind: str = "measured", note: str = "",
            align: bool = True, chunks: int = 1, waits: list[Event] = (), ends=(), verdict: str = "",
            marked=(), sections=()) -> Timeline:
    """Match the messages, put the ranks on one clock (see clocks.py), start the step at time 0.
    `waits` and `ends` (of a run that did not finish), and `marked` ((event of `events`, words) to point out),
    go on the same clock. `sections`: (words, [indices into `events`]) to name above the run, each from the first
    of its events to the last."""
    events, waits = list(events), list(waits)
    points, words = [e for e, _ in marked], [w for _, w in marked]
    offsets: dict[int, float] = {}
    raw_bubble = measured_bubble(events, p) if any(e.is_compute for e in events) else None
    if align:
        offsets = clock_offsets(match(events).pairs, p)
        events, waits, points = shift(events, offsets), shift(waits, offsets), shift(points, offsets)
        ends = [(r, t + offsets.get(r, 0.0), what) for r, t, what in ends]
    t0 = min((e.t_start for e in events + waits), default=0.0)
    if t0:
        back = {r: -t0 for r in range(p)}
        events, waits, points = shift(events, back), shift(waits, back), shift(points, back)
        ends = [(r, t - t0, what) for r, t, what in ends]
    spans = [(words, min(events[i].t_start for i in idx), max(events[i].t_end for i in idx))
             for words, idx in sections if idx and all(0 <= i < len(events) for i in idx)]
    events.sort(key=lambda e: (e.t_end, e.rank))
    offsets = {r: o for r, o in offsets.items() if o}
    if offsets:
        shifts = ", ".join(f"rank {r} {o * 1e3:+.2f} ms" for r, o in offsets.items())
        note = "; ".join(filter(None, [note, f"clocks aligned with the messages ({shifts})"]))
    return Timeline(events, p, m, match(events), offsets, kind, note, raw_bubble, chunks=chunks, waits=waits,
                    ends=list(ends), verdict=verdict, marked=list(zip(points, words)), sections=spans)


def wait_label(e: Event, chunks: int = 1) -> str:
    """'waits in recv_forward(mb=2, chunk 1) from rank 0': what the figures write on a rank left waiting
    (the chunk on an interleaved pipeline, where a micro-batch alone does not say which message)."""
    peer = f" {'to' if e.kind in SENDS else 'from'} rank {e.peer}" if e.peer is not None else ""
    return f"waits in {op_text(e.kind, e.microbatch, e.chunk, chunks > 1)}{peer}"


def _op_words(e: Event) -> str:
    """'send_forward of micro-batch 3'; a message of no micro-batch (q19's ring) is 'a send' or 'a receive'
    (trace.op_text): it is no pipeline's operation."""
    if e.microbatch is None and not e.is_compute:
        return op_text(e.kind, None)
    return f"{e.kind} of micro-batch {e.microbatch}"


def describe_wait(e: Event) -> str:
    """One line about an operation a rank was left in."""
    peer = f" {'to' if e.kind in SENDS else 'from'} rank {e.peer}" if e.peer is not None else ""
    return (f"rank {e.rank} · waited in {_op_words(e)}{peer} from {e.t_start * 1e3:.2f} ms "
            f"until the run was stopped at {e.t_end * 1e3:.0f} ms: the message never came")


def collective_calls(events: list[Event]) -> list[tuple[str, tuple, list[Event]]]:
    """Each all-reduce as one call: (kind, group, the members' events). The k-th all-reduce of a kind
    over a group on one member is the k-th on every other member (collectives run in the same order)."""
    seen: dict[tuple, list[list[Event]]] = {}
    counts: dict[tuple, int] = {}
    for e in sorted((e for e in events if e.is_collective), key=lambda e: (e.t_start, e.rank)):
        key = (e.kind, e.group, e.rank)
        k = counts[key] = counts.get(key, -1) + 1
        calls = seen.setdefault((e.kind, e.group), [])
        while len(calls) <= k:
            calls.append([])
        calls[k].append(e)
    return [(kind, group, members) for (kind, group), calls in seen.items() for members in calls]


def describe(e: Event, matched: tuple[Event, Event] | None = None, chunks: int = 1) -> str:
    """One line about an event: the op, its rank and peer, micro-batch, shape, bytes and duration."""
    if e.is_collective:
        return (f"rank {e.rank} · {COLLECTIVE_LABELS.get(e.kind, e.kind)} over ranks {list(e.group or ())} · "
                f"{e.bytes:,} bytes · {e.t_start * 1e3:.2f}–{e.t_end * 1e3:.2f} ms ({e.duration * 1e3:.2f} ms)")
    what = f"rank {e.rank} · {_op_words(e)}" + (f" on chunk {e.chunk}" if chunks > 1 else "")
    if not e.is_compute:
        what += f" {'to' if e.kind in SENDS else 'from'} rank {e.peer}"
    if e.shape:                         # () is the last stage's loss: nothing to show
        what += f" · shape {tuple(e.shape)}"
    if not e.is_compute:
        what += f" · {e.bytes:,} bytes"
        if matched is None:
            what += " · UNMATCHED"
    return what + f" · {e.t_start * 1e3:.2f}–{e.t_end * 1e3:.2f} ms ({e.duration * 1e3:.2f} ms)"
