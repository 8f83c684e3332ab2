"""The digit classifier: the lab's transformer, read out at the last position, trained with cross-entropy.

The model is unchanged (`model.py`): an image's 64 pixel tokens go in, logits over the 17 grey levels
come out at every position. The scores of tokens 0..9 at the *last* position are the scores of the ten
digits (causal attention lets the last position see every pixel).

In a pipeline only the last stage holds the head, so only it can compute the loss, and so only it needs
the labels. `ClassifierStage` is a `PipelineStage` whose last stage ends in the loss: give it the labels
of the step's micro-batches with `set_labels`, and its forward of micro-batch k returns each image's
cross-entropy against label micro-batch k. The mean of that output is the micro-batch's loss, exactly
the quantity q08's step already takes as its loss (`output.mean() / num_microbatches`), so the step
trains on the real loss without a change. Without labels (`set_labels(None)`, for evaluation) the last
stage returns the ten class scores of each image.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab_src.topics.training.digits import NUM_CLASSES
from lab_src.pipeline.stage import PipelineStage


def class_scores(logits: torch.Tensor) -> torch.Tensor:
    """(batch, seq, vocab) logits -> (batch, 10): the digit scores at the last position."""
    return logits[:, :, :NUM_CLASSES].mean(dim=1)


class ClassifierStage(PipelineStage):
    """A stage of the digit classifier. Besides what a `PipelineStage` does, it keeps a record of each
    forward (`forwards`: in training or eval mode, with or without autograd, with or without labels),
    which the checks read."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.labels: list[torch.Tensor] | None = None
        self.forwards: list[dict] = []

    def set_labels(self, labels) -> None:
        """The labels of the coming step's micro-batches (a list of `num_microbatches` tensors of shape
        (micro_batch_size,)), or None: then the last stage's forward returns class scores."""
        if labels is None:
            self.labels = None
            return
        labels = list(labels)       # (on a stage that is not the last they are kept, and never used)
        for k, t in enumerate(labels):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.is_floating_point():
                raise TypeError(f"stage {self.pp_rank}: label micro-batch {k} must be a 1-D tensor of digits, "
                                f"got {t!r:.80}")
        self.labels = [t.to(self.device) for t in labels]

    def forward(self, x: torch.Tensor, microbatch: int = 0) -> torch.Tensor:
        out = super().forward(x, microbatch)
        self.forwards.append({"microbatch": microbatch, "training": self.training,
                              "grad": torch.is_grad_enabled(), "labelled": self.labels is not None})
        if not self.is_last_stage:
            return out
        scores = class_scores(out)
        if self.labels is None:
            return scores
        if not 0 <= microbatch < len(self.labels):
            raise IndexError(f"stage {self.pp_rank}: forward of micro-batch {microbatch}, but set_labels gave "
                             f"labels for {len(self.labels)} micro-batches")
        target = self.labels[microbatch]
        if target.shape[0] != scores.shape[0]:
            raise ValueError(f"stage {self.pp_rank}, micro-batch {microbatch}: {target.shape[0]} labels for "
                             f"{scores.shape[0]} images")
        return F.cross_entropy(scores, target, reduction="none")
