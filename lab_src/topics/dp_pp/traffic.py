"""What a step sends, by kind, read from its event record (q14).

Three kinds of traffic make up a step of data x pipeline parallelism:

    pipeline        activations sent forward and their gradients sent back between neighbouring stages
    data_parallel   the gradients each rank hands to the all-reduce over its data-parallel set
    tied            the tied embedding's gradient each first and last stage hands to their all-reduce

`bytes_by_kind` counts what the record holds: the bytes of every send, and the buffer each rank hands
to each all-reduce, summed over all ranks. That is what q14's prediction asks for. What a collective puts
on the wire depends on its algorithm: a ring all-reduce over n ranks sends 2(n-1)/n of the buffer from
every rank (n-1 steps to add up the pieces, n-1 to hand them round), which `wire_bytes_by_kind` applies.
"""
from __future__ import annotations

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.trace import Event

TRAFFIC_KINDS = ("pipeline", "data_parallel", "tied")
BY_EVENT = {"send_forward": "pipeline", "send_backward": "pipeline", "allreduce_dp": "data_parallel",
            "allreduce_tied": "tied"}

# What the students predict before measuring (q14): the 2 x 2 grid the visible check runs first.
PREDICTION_NAME = "predicted_bytes"     # a function of the answer cell
PREDICTION_CONFIG = LabConfig(num_layers=4, hidden_size=32, num_heads=4, seq_len=16, vocab_size=64,
                              global_batch_size=24, num_microbatches=3, num_stages=2, dp_size=2, tie_embeddings=True)


def kind_of(e: Event) -> str | None:
    return BY_EVENT.get(e.kind)


def ring_factor(n: int) -> float:
    """The share of its buffer each rank sends in a ring all-reduce over n ranks: 2(n-1)/n."""
    return 2 * (n - 1) / n if n > 1 else 0.0


def bytes_by_kind(events: list[Event]) -> dict[str, int]:
    """Bytes per kind in the record: sends, and buffers handed to all-reduces, over all ranks."""
    out = dict.fromkeys(TRAFFIC_KINDS, 0)
    for e in events:
        kind = kind_of(e)
        if kind:
            out[kind] += e.bytes
    return out


def wire_bytes_by_kind(events: list[Event]) -> dict[str, float]:
    """Bytes per kind that leave the ranks: a send's bytes, 2(n-1)/n of an all-reduce's buffer (ring)."""
    out = dict.fromkeys(TRAFFIC_KINDS, 0.0)
    for e in events:
        kind = kind_of(e)
        if kind:
            out[kind] += e.bytes * (ring_factor(len(e.group or ())) if e.is_collective else 1)
    return out


def calls_by_kind(events: list[Event]) -> dict[str, int]:
    """How many operations of each kind all ranks ran (sends; each rank's share of each all-reduce)."""
    out = dict.fromkeys(TRAFFIC_KINDS, 0)
    for e in events:
        kind = kind_of(e)
        if kind:
            out[kind] += 1
    return out


def table(measured: dict, predicted: dict | None = None, wire: dict | None = None) -> str:
    """Bytes per kind as text: the record, the prediction beside it, what a ring puts on the wire."""
    head = f"{'kind':<15}{'measured (B)':>15}" + (f"{'predicted (B)':>15}" if predicted is not None else "") + \
        (f"{'on the wire (B)':>17}" if wire is not None else "")
    lines = [head]
    for k in TRAFFIC_KINDS:
        row = f"{k:<15}{measured.get(k, 0):>15,}"
        if predicted is not None:
            p = predicted.get(k)
            row += f"{p:>15,.0f}" if isinstance(p, (int, float)) else f"{'-':>15}"
            if isinstance(p, (int, float)) and p != measured.get(k, 0):
                row += "  <- differs"
        if wire is not None:
            row += f"{wire.get(k, 0):>17,.0f}"
        lines.append(row)
    return "\n".join(lines)
