"""One run's configuration: the model, the batch and the pipeline, in one small record.

The same record travels from a notebook (or the grader) to every torchrun rank as JSON, so that all
ranks and the unsharded baseline agree on every number.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass


@dataclass(frozen=True)
class LabConfig:
    # the model: a tiny decoder-style transformer
    num_layers: int = 8          # transformer blocks; these are what the pipeline distributes
    hidden_size: int = 32
    num_heads: int = 4
    seq_len: int = 16
    vocab_size: int = 64
    # the batch
    global_batch_size: int = 8   # samples in one optimizer step
    num_microbatches: int = 4    # how many pieces the batch is cut into
    # the pipeline
    num_stages: int = 4          # pipeline-parallel world size
    seed: int = 0
    dtype: str = "float32"       # "float32" or "float64"

    def replace(self, **changes) -> "LabConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LabConfig":
        return cls(**d)

    @property
    def torch_dtype(self):
        import torch
        return {"float32": torch.float32, "float64": torch.float64}[self.dtype]

    @property
    def layers_divide_evenly(self) -> bool:
        return self.num_layers % self.num_stages == 0

    def key(self) -> str:
        """A short stable name for this configuration (file names, cache keys)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:10]

    def describe(self) -> str:
        return (f"{self.num_stages} stages, {self.num_layers} layers, batch {self.global_batch_size} "
                f"in {self.num_microbatches} micro-batches, seed {self.seed}, {self.dtype}")


# A configuration large enough that compute, not messaging, dominates a step on a CPU: the demo and
# the benchmark use it so that the measured bubble means something.
DEMO = LabConfig(num_layers=8, hidden_size=256, num_heads=8, seq_len=128, vocab_size=512,
                 global_batch_size=32, num_microbatches=8, num_stages=4, seed=0)
