"""What one training step of the digits model moves, tensor parallel against pipeline parallel (q18),
counted as q14 counts (topics/dp_pp/traffic.py): the bytes of every send, and the buffer each rank hands to
each all-reduce, summed over all ranks (what a ring then puts on the wire is 2(t-1)/t of that).

    tensor_parallel   t ranks, each block's attention and MLP reduced once each way: 4 all-reduces of the
                      (batch, seq, hidden) activation per block and step, on each of the t ranks
    pipeline          p stages: each of the p - 1 boundaries sends the activation of every micro-batch
                      forward and its gradient back

`expected_bytes(cfg, t, p)` is the count for a t x p grid of `cfg`; `measured_bytes(events, steps, sent)` reads
the record of a training run (topics/tensor_parallel/kind_train.py). The prediction the students make (q18) is the
digits model's, `PREDICTION`: t = 2 alone, and p = 2 alone.
"""
from __future__ import annotations

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.trace import Event
from lab_src.topics.training.digits import DIGITS

PREDICTION_NAME = "predicted_bytes"       # a function of the q18 answer cell: {"tensor_parallel", "pipeline"}
PREDICTION = DIGITS                       # 4 blocks, hidden 32, 64 pixels, batches of 32 in 4 micro-batches
KINDS = ("tensor_parallel", "pipeline")


def activation_bytes(cfg: LabConfig, microbatches: int = 1) -> int:
    b = cfg.global_batch_size // microbatches
    return b * cfg.seq_len * cfg.hidden_size * (8 if cfg.dtype == "float64" else 4)


def expected_bytes(cfg: LabConfig, t: int, p: int) -> dict[str, int]:
    """Bytes one training step moves on a t x p grid of `cfg` (t = 1: no tensor parallelism; p = 1: no
    pipeline, the whole batch at once)."""
    tp = 4 * cfg.num_layers * t * activation_bytes(cfg) if t > 1 else 0
    m = cfg.num_microbatches if p > 1 else 1
    pp = 2 * (p - 1) * m * activation_bytes(cfg, m) * t
    return {"tensor_parallel": tp, "pipeline": pp}


def measured_bytes(events: list[Event], steps: int, sent: int = 0) -> dict[str, float]:
    """Bytes per step of a training run: its record's all-reduces over more than one rank, and the bytes
    its ranks sent between stages (`sent`: the sum of the ranks' `sent_bytes`)."""
    tp = sum(e.bytes for e in events if e.kind == "all_reduce" and len(e.group or ()) > 1)
    return {"tensor_parallel": tp / max(steps, 1), "pipeline": sent / max(steps, 1)}
