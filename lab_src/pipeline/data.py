"""A synthetic token dataset and its dataloader.

The tokens depend only on the run seed, so the baseline (one batch of `global_batch_size` samples)
and the pipeline (`num_microbatches` micro-batches of `micro_batch_size`) see the same samples in
the same order. The module counts the dataloaders a process creates: a check uses the count to show
which ranks needed one (exercise q06).
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from lab_src.pipeline.config import LabConfig

CREATED = {"dataloaders": 0}


class SyntheticTokens(Dataset):
    """`num_samples` rows of `seq_len` token ids, drawn once from a generator seeded by the run seed."""

    def __init__(self, cfg: LabConfig, num_samples: int | None = None):
        n = num_samples or cfg.global_batch_size
        g = torch.Generator().manual_seed(cfg.seed + 1_000_003)
        self.tokens = torch.randint(0, cfg.vocab_size, (n, cfg.seq_len), generator=g)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


def make_dataloader(cfg: LabConfig, batch_size: int) -> DataLoader:
    """Batches of `batch_size` rows, in order (no shuffling), over one global batch of samples."""
    CREATED["dataloaders"] += 1
    return DataLoader(SyntheticTokens(cfg), batch_size=batch_size, shuffle=False)
