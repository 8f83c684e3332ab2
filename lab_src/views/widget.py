"""The animated P2P timeline: Play and a slider step through the run's events in the order they ended.

    [ measured | ideal ]  [▶ ■ ⟳]  event ━━━━━━●━━━━━━━━ 23
    +--------------------------------------------+  Bubble: measured, ideal, theory; step times
    | one row per rank, boxes, arrows, cursor    |  Bytes sent by each rank
    +--------------------------------------------+  notes (clock alignment, cost model)
    event 23/80 · t = 21.1 ms · rank 2 · send_forward of micro-batch 3 to rank 3 · shape ... · bytes

Event k (1 to n) shows the run at the moment its k-th event finished (the slider says "event", not "step": a
training step, a ring's step and a schedule's step are other things a lab's text names). A run stopped before any
operation ended still draws where each rank was left waiting. Each view has its own time axis
(the ideal step is often much shorter than the measured one); the side panel gives both step times.
The frame is inline SVG in an ipywidgets.HTML (see svg.py), redrawn by the kernel whenever the slider
moves; Play moves the slider in the browser.
"""
from __future__ import annotations

from html import escape

import ipywidgets as w

from lab_src.views import memory, svg
from lab_src.views.prepare import Timeline, describe


class TimelineWidget(w.VBox):
    def __init__(self, measured: Timeline, ideal: Timeline | None, title: str = "", interval_ms: int = 200):
        # the second view: the schedule model's step ("ideal"), or this run's own order with emulated compute
        self.views = {"measured": measured} if ideal is None else {"measured": measured, ideal.kind: ideal}
        second = ("your run's order, each box a cost model's length (views/emulated.py)" if ideal is not None
                  and ideal.kind != "ideal" else "the same schedule under a simple cost model")
        self.toggle = w.ToggleButtons(options=list(self.views), value="measured",
                                      tooltips=["what your run did", second][:len(self.views)],
                                      style={"button_width": "130px" if len(max(self.views, key=len)) > 8 else "90px"})
        self.play = w.Play(interval=interval_ms, min=1, max=1, step=1, description="play")
        self.slider = w.IntSlider(min=1, max=1, description="event", continuous_update=True,
                                  layout=w.Layout(width="420px"))
        w.jslink((self.play, "value"), (self.slider, "value"))   # the browser advances the slider itself
        self.frame = w.HTML(layout=w.Layout(flex="1 1 600px", max_width="860px"))
        self.side = w.HTML(layout=w.Layout(flex="0 0 280px", margin="0 0 0 12px"))
        self.info = w.HTML()
        header = w.HTML(f"<b>{escape(title)}</b>") if title else w.HTML()
        super().__init__([header, w.HBox([self.toggle, self.play, self.slider]),
                          w.HBox([self.frame, self.side], layout=w.Layout(flex_flow="row wrap")), self.info])
        self.add_class("pp-timeline")
        self._set_view("measured", fraction=1.0)
        self.slider.observe(lambda _: self.redraw(), names="value")
        self.toggle.observe(self._on_toggle, names="value")

    @property
    def view(self) -> Timeline:
        return self.views[self.toggle.value]

    def _on_toggle(self, change) -> None:
        n = len(self.views[change["old"]].events)
        self._set_view(change["new"], fraction=(self.slider.value - 1) / max(n - 1, 1))

    def _set_view(self, name: str, fraction: float) -> None:
        """Show view `name` at the same relative position in its own list of steps."""
        n = max(len(self.views[name].events), 1)
        with self.hold_trait_notifications():
            for control in (self.slider, self.play):
                control.max = max(control.max, n)
                control.value = 1 + round(fraction * (n - 1))
                control.max = n
        self.side.value = self._side_panel()
        self.redraw()

    def redraw(self) -> None:
        tl = self.view
        if not tl.events and tl.unfinished:     # stopped before any operation ended: where each rank waited
            self.frame.value = svg.frame(tl, None)
            self.info.value = ('<div class="pp-timeline-info">No operation had ended when the run was stopped: in red, '
                               "the operation each rank was left waiting in (hover for details).</div>")
            return
        if not tl.events:
            self.frame.value, self.info.value = "<i>No events were recorded in this run.</i>", ""
            return
        i = min(self.slider.value, len(tl.events)) - 1
        self.frame.value = svg.frame(tl, i)
        e = tl.events[i]
        self.info.value = (f'<div class="pp-timeline-info">event {i + 1}/{len(tl.events)} · '
                           f"t = {e.t_end * 1e3:.2f} ms · {escape(describe(e, tl.arrow_of(e), tl.chunks))}</div>")

    def _side_panel(self) -> str:
        measured = self.views["measured"]
        ideal = list(self.views.values())[-1] if len(self.views) > 1 else None    # no second view: q19, q20

        def pct(x):
            return "n/a" if x is None else f"{x:.1%}"

        rows = "".join(f"<tr><td>rank {r}</td><td style='text-align:right'>{n:,} B</td></tr>"
                       for r, n in self.view.bytes_sent().items())
        raw = ""
        notes = []
        if measured.offsets:
            shifts = ", ".join(f"rank {r} {o * 1e3:+.2f} ms" for r, o in measured.offsets.items())
            notes.append(f"The ranks' clocks were aligned with the messages ({shifts}), so that no message "
                         f"arrives before it was sent.")
            if measured.raw_bubble is not None:
                raw = f" ({pct(measured.raw_bubble)} before aligning)"
        if measured.verdict or measured.waits:
            notes.insert(0, "This run did not finish" + (f": {measured.verdict}" if measured.verdict else "")
                         + ". In red: where each rank was left waiting (hover for details), sends no receive took, "
                           "and where a rank raised.")
        if not measured.matching.ok:
            notes.append("Unmatched messages: " + "; ".join(measured.matching.problems()))
        if ideal is not None and not measured.compute_free:    # a run of messages alone has no second view
            notes.append(f"{ideal.kind.capitalize()}: {ideal.note.removeprefix(ideal.kind + ': ')}.")
        # a run that did not finish: how long it ran until stopped, not the span of what ended (nothing, maybe)
        ran = (f"stopped after {measured.stopped_at * 1e3:.0f} ms" if measured.unfinished
               else f"run time: {measured.span * 1e3:.1f} ms")
        if measured.compute_free:        # a run of messages alone (q19's ring): no schedule, no bubble
            return (f'<div class="pp-timeline-side" style="font-size:12px; line-height:1.45">'
                    f"{ran}<br>{escape(measured.compute_free)}<br><br>"
                    f"<b>Bytes sent</b><table>{rows}</table><br>"
                    + "".join(f"<div style='color:{'#b00' if n.startswith('This run did not finish') else '#555'}'>"
                              f"{escape(n)}</div>" for n in notes) + "</div>")
        if not measured.has_compute:
            notes.append("No forward/backward was recorded: the messages are all there is.")
        if not measured.has_compute and measured.pipeline_p < 2:
            head = ""          # one stage and no compute boxes (q16's split alone): no bubble, no idle time to say
        elif not measured.bubble_meant:
            # one stage (q21's data-parallel ranks): idle time, but no pipeline and so no bubble or its theory
            recv = measured.receive_share()
            head = (f"<b>Idle time</b> (share of the ranks' time not computing)<br>"
                    f"measured: <b>{pct(measured.bubble)}</b>{raw}<br>"
                    + (f"in receives (waiting): {pct(recv)} of the ranks' time<br>" if recv else "")
                    + "one stage: no pipeline, so no pipeline bubble and no formula for one<br>")
        else:
            # the formula of the schedule that ran, with this view's boxes (ZB-H1's T_F, T_I, T_W: q16)
            words, value = self.view.theory_words()
            words = words.replace("with these boxes", f"with the {self.toggle.value} view's boxes")
            head = (f"<b>Bubble</b> (idle share of the step)<br>"
                    f"measured: <b>{pct(measured.bubble)}</b>{raw}<br>"
                    + (f"{ideal.kind}: {pct(ideal.bubble)}<br>" if ideal is not None else "")
                    + f"{escape(words)} = <b>{value:.1%}</b><br>")
        return ('<div class="pp-timeline-side" style="font-size:12px; line-height:1.45">' + head
                + (f"step time: measured {measured.stopped_at * 1e3:.1f} ms (stopped)" if measured.unfinished
                   else f"step time: measured {measured.span * 1e3:.1f} ms")
                + (f", {ideal.kind} {ideal.span * 1e3:.1f} ms" if ideal is not None else "") + "<br><br>"
                f"<b>Bytes sent</b> ({self.toggle.value})<table>{rows}</table><br>"
                + (f"<b>Activation memory</b> (peak held for backward)<br>"
                   f"{escape(memory.describe_peaks(measured.events, measured.p))}<br><br>"
                   if memory.has_memory(measured) and not memory.has_state(measured) else "")
                + ("<b>Memory by kind</b> (each rank at its peak, KiB or MiB)<br>"
                   + "<br>".join(escape(line) for line in memory.describe_state(measured.events, measured.p))
                   + "<br><br>" if memory.has_state(measured) else "")
                + "".join(f"<div style='color:{'#b00' if n.startswith('This run did not finish') else '#555'}'>"
                          f"{escape(n)}</div>" for n in notes) + "</div>")
