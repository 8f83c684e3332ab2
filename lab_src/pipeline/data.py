"""A synthetic token dataset and its dataloader.

The tokens depend only on the run seed, so the baseline (one batch of `global_batch_size` samples)
and the pipeline (`num_microbatches` micro-batches of `micro_batch_size`) see the same samples in
the same order. The module counts the dataloaders a process creates: a check uses the count to show
which ranks needed one (exercise q06).

With data parallelism (`cfg.dp_size` replicas, q14) the global batch is made of one shard per replica,
in replica order; shard d holds `global_batch_size / dp_size` samples drawn from a stream seeded by the
run seed and d, the replica's data-parallel coordinate. `make_dataloader(cfg, b, dp_rank=d)` reads
shard d alone; without `dp_rank` it reads the whole global batch (what the baseline reads). With one
replica the one shard is exactly the dataset there was before data parallelism.
"""
from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset

from lab_src.pipeline.config import LabConfig

CREATED = {"dataloaders": 0}
SHARDS: list[tuple] = []    # (dp_rank, dp_size, batch_size) of each dataloader this process created (q14)


def shard_seed(cfg: LabConfig, dp_rank: int) -> int:
    """The seed of replica `dp_rank`'s stream of samples: the run seed and the data-parallel coordinate."""
    return cfg.seed + 1_000_003 + 7_919 * dp_rank


class SyntheticTokens(Dataset):
    """Rows of `seq_len` token ids: the global batch (every shard, in replica order), or shard `dp_rank`."""

    def __init__(self, cfg: LabConfig, num_samples: int | None = None, dp_rank: int | None = None):
        dp = max(1, cfg.dp_size)
        if dp_rank is not None and not 0 <= dp_rank < dp:
            raise ValueError(f"there is no data-parallel replica {dp_rank}: the replicas are 0..{dp - 1}")
        n = num_samples or cfg.global_batch_size
        per_shard = max(1, n // dp)
        shards = range(dp) if dp_rank is None else [dp_rank]
        parts = []
        for d in shards:
            g = torch.Generator().manual_seed(shard_seed(cfg, d))
            parts.append(torch.randint(0, cfg.vocab_size, (per_shard, cfg.seq_len), generator=g))
        self.tokens = torch.cat(parts)

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.tokens[i]


def make_dataloader(cfg: LabConfig, batch_size: int, dp_rank: int | None = None) -> DataLoader:
    """Batches of `batch_size` rows, in order (no shuffling), over one global batch of samples, or,
    with `dp_rank`, over that data-parallel replica's shard of it."""
    CREATED["dataloaders"] += 1
    SHARDS.append((dp_rank, cfg.dp_size, batch_size))
    return DataLoader(SyntheticTokens(cfg, dp_rank=dp_rank), batch_size=batch_size, shuffle=False)
