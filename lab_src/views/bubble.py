"""The pipeline bubble: the share of the step in which stages sit idle.

For All-Forward-All-Backward with p stages and m micro-batches, if every stage takes the same time
for a forward and the same for a backward and messages are free, the bubble is (p-1)/(m+p-1).
The measured bubble is one minus the time ranks spent computing, over p times the step's span.

With v chunks per rank (Interleaved 1F1B), a rank's idle time at the ends of the step shrinks to
(p-1)/v of a stage's forward and backward, so the idle share of the step is (p-1)/(v*m+p-1). It is
the same quantity as the measured bubble (idle over the whole step). Megatron-LM's paper writes
(p-1)/(v*m) instead: idle time over compute time, which is not a share and exceeds 1 for m < p.
"""
from __future__ import annotations

from lab_src.pipeline.trace import Event


def theoretical_bubble(p: int, m: int, v: int = 1) -> float:
    """The idle share of a step in theory: (p-1)/(v*m+p-1); v = 1 for one chunk per rank."""
    return (p - 1) / (v * m + p - 1)


def theory_text(p: int, m: int, v: int = 1) -> str:
    """'theory (p-1)/(m+p-1) = (4-1)/(8+4-1) = 27.3%', with v*m where there are v > 1 chunks per rank."""
    if v > 1:
        return f"theory (p-1)/(v·m+p-1) = ({p}-1)/({v}·{m}+{p}-1) = {theoretical_bubble(p, m, v):.1%}"
    return f"theory (p-1)/(m+p-1) = ({p}-1)/({m}+{p}-1) = {theoretical_bubble(p, m):.1%}"


def measured_bubble(events: list[Event], p: int) -> float | None:
    if not events:
        return None
    span = max(e.t_end for e in events) - min(e.t_start for e in events)
    if span <= 0:
        return None
    busy = sum(e.duration for e in events if e.is_compute)
    return max(0.0, 1.0 - busy / (p * span))


def bytes_sent(events: list[Event], p: int) -> dict[int, int]:
    return {r: sum(e.bytes for e in events if e.rank == r and e.is_send) for r in range(p)}


def describe(events: list[Event], p: int, m: int, v: int = 1) -> str:
    measured = measured_bubble(events, p)
    got = f"{measured:.1%}" if measured is not None else "n/a"
    return f"bubble: measured {got}, {theory_text(p, m, v)}"


def zero_bubble_theory(p: int, m: int, t_f: float, t_b: float, t_w: float) -> float:
    """ZB-H1's bubble as a share of the step (Qi et al. 2024, Table 2): each rank idles (p - 1)(T_F + T_B - T_W)
    of a step that computes m (T_F + T_B + T_W), with T_B the input's half of a backward (I) and T_W the
    weights' (W). With equal times, (p - 1) / (3m + p - 1); 1F1B's is (p - 1)(T_F + T_B + T_W) idle."""
    idle = (p - 1) * max(t_f + t_b - t_w, 0.0)
    return idle / (m * (t_f + t_b + t_w) + idle)


def split_box_times(events) -> tuple[float, float, float] | None:
    """Mean durations of the forward (F), input-gradient (I) and weight-gradient (W) boxes of a run whose
    backward is split (q16); None where the run has no W."""
    def mean(kind):
        boxes = [e.t_end - e.t_start for e in events if e.kind == kind]
        return sum(boxes) / len(boxes) if boxes else 0.0
    times = mean("forward"), mean("backward_input"), mean("backward_weight")
    return times if all(times) else None


def zero_bubble_text(events, p: int, m: int) -> str | None:
    """'ZB-H1 theory (p-1)(T_F+T_I-T_W) with these boxes = 9.1%' for a run with a split backward, else None:
    1F1B's (p-1)/(m+p-1) assumes one backward box per micro-batch and says nothing of such a run."""
    times = split_box_times(events)
    if times is None:
        return None
    return f"ZB-H1 theory (p-1)(T_F+T_I-T_W) with these boxes = {zero_bubble_theory(p, m, *times):.1%}"

