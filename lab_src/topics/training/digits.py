"""A real data set for training (exercise q13): scikit-learn's handwritten digits, read from the copy
scikit-learn ships, so nothing is downloaded.

1,797 images of 8x8 pixels, each pixel one of 17 grey levels (0..16), ten classes. An image becomes a
sequence of 64 tokens, its pixels row by row (the token is the grey level: vocabulary 17), and the
model's job is to name the digit at the last position: the scores of tokens 0..9 there are the scores
of the ten digits (`topics/training/classifier.py`). Small enough to train on two CPU cores in seconds, real
enough that the learning curve and the held-out accuracy mean something.

The split is fixed (the same held-out images for every run); the order of the training images depends
on the run seed, epoch by epoch, so that the pipeline and the single-process model see the same
batches. Each process counts what it reads (`READS`): a check uses the counts to show which ranks read
the tokens (the first stage) and which the labels (the last).
"""
from __future__ import annotations

import functools
import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from lab_src.pipeline.config import LabConfig

NUM_CLASSES = 10
GREY_LEVELS = 17            # pixel values 0..16: the vocabulary
PIXELS = 64                 # 8 x 8: the sequence length
TEST_IMAGES = 360           # held out, the same for every run (20 %)
SPLIT_SEED = 2024

# What this process read, by kind: "train_tokens", "train_labels", "test_tokens", "test_labels".
READS: Counter = Counter()

# The configuration of the digits runs: 4 stages of one block each, batches of 32 images in 4
# micro-batches. A sequence of 64 pixels, 17 grey levels.
DIGITS = LabConfig(num_layers=4, hidden_size=32, num_heads=4, seq_len=PIXELS, vocab_size=GREY_LEVELS,
                   global_batch_size=32, num_microbatches=4, num_stages=4, seed=0)


def data_file() -> Path:
    """scikit-learn's own copy of the data set, found without importing scikit-learn (whose import
    costs a second or more in every rank of a run)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the digits come with scikit-learn: pip install scikit-learn==1.9.1")
    return Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"


@functools.lru_cache(maxsize=1)
def load_images() -> tuple[np.ndarray, np.ndarray]:
    """(pixels, labels): 1,797 rows of 64 grey levels (0..16), and the digit of each row. Read the way
    `sklearn.datasets.load_digits` reads it (tests/test_q13_train_pipeline.py checks they agree); falls
    back to that function if its file has moved."""
    path = data_file()
    if path.exists():
        table = np.loadtxt(path, delimiter=",")
        pixels, labels = table[:, :-1], table[:, -1]
    else:                                                   # pragma: no cover - another scikit-learn layout
        from sklearn.datasets import load_digits
        bunch = load_digits()
        pixels, labels = bunch.data, bunch.target
    return pixels.astype(np.int64), labels.astype(np.int64)


@functools.lru_cache(maxsize=1)
def split() -> dict[str, torch.Tensor]:
    """The fixed train/test split: tokens (n, 64) and labels (n,) of each part."""
    pixels, labels = load_images()
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    tokens, targets = torch.from_numpy(pixels)[order], torch.from_numpy(labels)[order]
    return {"test_tokens": tokens[:TEST_IMAGES], "test_labels": targets[:TEST_IMAGES],
            "train_tokens": tokens[TEST_IMAGES:], "train_labels": targets[TEST_IMAGES:]}


class Digits:
    """The digits of one run: each training step's batch, cut into micro-batches, and the held-out set.

        data = Digits(cfg)
        data.train_tokens(step)   # the step's micro-batches of pixel tokens: the first stage reads these
        data.train_labels(step)   # the same micro-batches' digits: the last stage reads these
        data.test_tokens()        # the held-out images in micro-batches of the same size
        data.test_labels()

    A step's batch is `global_batch_size` images; the micro-batches are its consecutive pieces, so
    micro-batch k of `train_tokens(step)` and of `train_labels(step)` are the same images. The training
    images are visited in an order drawn from the run seed, a new one every epoch.
    """

    def __init__(self, cfg: LabConfig, test_microbatches: int | None = None):
        if cfg.seq_len != PIXELS or cfg.vocab_size < GREY_LEVELS:
            raise ValueError(f"the digits need seq_len={PIXELS} and vocab_size>={GREY_LEVELS}; use lab_src.pipeline."
                             f"digits.DIGITS (got seq_len={cfg.seq_len}, vocab_size={cfg.vocab_size})")
        if cfg.global_batch_size % cfg.num_microbatches:
            raise ValueError(f"a batch of {cfg.global_batch_size} does not split into {cfg.num_microbatches} micro-batches")
        self.cfg = cfg
        self.num_microbatches = cfg.num_microbatches
        self.micro_batch_size = cfg.global_batch_size // cfg.num_microbatches
        parts = split()
        self._train_tokens, self._train_labels = parts["train_tokens"], parts["train_labels"]
        whole = len(parts["test_labels"]) // self.micro_batch_size
        self.num_test_microbatches = min(whole, test_microbatches or whole)
        n_test = self.num_test_microbatches * self.micro_batch_size
        self._test_tokens, self._test_labels = parts["test_tokens"][:n_test], parts["test_labels"][:n_test]
        self.steps_per_epoch = len(self._train_labels) // cfg.global_batch_size
        self._orders: dict[int, torch.Tensor] = {}

    def __repr__(self) -> str:
        return (f"Digits({len(self._train_labels)} training images, batches of {self.cfg.global_batch_size} in "
                f"{self.num_microbatches} micro-batches of {self.micro_batch_size}; {len(self._test_labels)} held out "
                f"in {self.num_test_microbatches} micro-batches)")

    # ---- the whole batch (the single-process model reads these) ------------------------------
    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, 64), labels (B,)) of training step `step` (not counted: not a rank's read)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch not in self._orders:
            g = torch.Generator().manual_seed(self.cfg.seed * 1_000 + epoch + 17)
            self._orders[epoch] = torch.randperm(len(self._train_labels), generator=g)
        B = self.cfg.global_batch_size
        rows = self._orders[epoch][k * B:(k + 1) * B]
        return self._train_tokens[rows], self._train_labels[rows]

    def test_set(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._test_tokens, self._test_labels

    # ---- what the stages read, in micro-batches ---------------------------------------------
    def train_tokens(self, step: int) -> list[torch.Tensor]:
        READS["train_tokens"] += 1
        return list(self.batch(step)[0].split(self.micro_batch_size))

    def train_labels(self, step: int) -> list[torch.Tensor]:
        READS["train_labels"] += 1
        return list(self.batch(step)[1].split(self.micro_batch_size))

    def test_tokens(self) -> list[torch.Tensor]:
        READS["test_tokens"] += 1
        return list(self._test_tokens.split(self.micro_batch_size))

    def test_labels(self) -> list[torch.Tensor]:
        READS["test_labels"] += 1
        return list(self._test_labels.split(self.micro_batch_size))
