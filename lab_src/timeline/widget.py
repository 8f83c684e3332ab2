"""The animated P2P timeline: Play and a slider step through the run's events in the order they ended.

    [ measured | ideal ]  [▶]  step ━━━━━━●━━━━━━━━
    +--------------------------------------------+  bubble: measured / ideal / theory
    | one row per rank, boxes, arrows, cursor    |  bytes each rank sent
    +--------------------------------------------+
    step 23/80 · t = 21.1 ms · rank 2 · send_forward of micro-batch 3 to rank 3 · shape ... · bytes

The frame is inline SVG in an ipywidgets.HTML (see svg.py), redrawn by the kernel at each step.
"""
from __future__ import annotations

from html import escape

import ipywidgets as w

from . import svg
from .data import Timeline, describe


class TimelineWidget(w.VBox):
    def __init__(self, measured: Timeline, ideal: Timeline, title: str = "", interval_ms: int = 300):
        self.views = {"measured": measured, "ideal": ideal}
        self.t_max = max(measured.span, ideal.span) or 1e-3    # one time axis for both views
        self.toggle = w.ToggleButtons(options=["measured", "ideal"], value="measured",
                                      tooltips=["what your run did", "the same schedule under a simple cost model"])
        self.play = w.Play(interval=interval_ms, min=0, max=0, step=1, description="play")
        self.slider = w.IntSlider(min=0, max=0, description="step", continuous_update=True,
                                  layout=w.Layout(width="420px"))
        w.jslink((self.play, "value"), (self.slider, "value"))   # the browser advances the slider itself
        self.frame = w.HTML(layout=w.Layout(min_width="860px"))
        self.side = w.HTML(layout=w.Layout(width="290px", margin="0 0 0 12px"))
        self.info = w.HTML()
        header = w.HTML(f"<b>{escape(title)}</b>") if title else w.HTML()
        super().__init__([header, w.HBox([self.toggle, self.play, self.slider]),
                          w.HBox([self.frame, self.side]), self.info])
        self.add_class("pp-timeline")
        self._set_view("measured", fraction=1.0)
        self.slider.observe(lambda _: self.redraw(), names="value")
        self.toggle.observe(self._on_toggle, names="value")

    @property
    def view(self) -> Timeline:
        return self.views[self.toggle.value]

    def _on_toggle(self, change) -> None:
        n = max(len(self.views[change["old"]].events) - 1, 1)
        self._set_view(change["new"], fraction=self.slider.value / n)

    def _set_view(self, name: str, fraction: float) -> None:
        """Show view `name` at the same relative position in its own list of steps."""
        last = max(len(self.views[name].events) - 1, 0)
        with self.hold_trait_notifications():
            for control in (self.slider, self.play):
                control.max = max(control.max, last)
                control.value = round(fraction * last)
                control.max = last
        self.side.value = self._side_panel()
        self.redraw()

    def redraw(self) -> None:
        tl = self.view
        if not tl.events:
            self.frame.value, self.info.value = "<i>No events were recorded in this run.</i>", ""
            return
        step = min(self.slider.value, len(tl.events) - 1)
        self.frame.value = svg.frame(tl, step, self.t_max)
        e = tl.events[step]
        self.info.value = (f'<div class="pp-timeline-info">step {step + 1}/{len(tl.events)} · '
                           f"t = {e.t_end * 1e3:.2f} ms · {escape(describe(e, tl.arrow_of(e)))}</div>")

    def _side_panel(self) -> str:
        measured, ideal = self.views["measured"], self.views["ideal"]

        def pct(x):
            return "n/a" if x is None else f"{x:.1%}"

        rows = "".join(f"<tr><td>rank {r}</td><td style='text-align:right'>{n:,} B</td></tr>"
                       for r, n in self.view.bytes_sent().items())
        notes = []
        if measured.offsets:
            shifts = ", ".join(f"rank {r} {o * 1e3:+.2f} ms" for r, o in measured.offsets.items())
            notes.append(f"Measured clocks aligned with the messages ({shifts}), so no message arrives "
                         f"before it was sent.")
        if not measured.matching.ok:
            notes.append("Unmatched messages: " + "; ".join(measured.matching.problems()))
        notes.append(f"Ideal: {ideal.note}.")
        if not measured.has_compute:
            notes.append("No forward/backward was recorded: the messages are all there is.")
        return (f'<div class="pp-timeline-side" style="font-size:12px; line-height:1.45">'
                f"<b>Bubble</b> (idle share of the step)<br>"
                f"measured: <b>{pct(measured.bubble)}</b><br>ideal: {pct(ideal.bubble)}<br>"
                f"theory (p-1)/(m+p-1) = ({measured.p}-1)/({measured.m}+{measured.p}-1) = "
                f"<b>{measured.theory:.1%}</b><br><br>"
                f"<b>Bytes sent</b> ({self.toggle.value})<table>{rows}</table><br>"
                + "".join(f"<div style='color:#555'>{escape(n)}</div>" for n in notes) + "</div>")
