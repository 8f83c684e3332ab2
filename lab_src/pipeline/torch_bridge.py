"""The lab's stages under torch.distributed.pipelining's own schedules: the bridge from the exercises to the
production API (the notebooks' `torch_bridge()`, harness/kinds/torch_schedule.py) and the benchmarks that
time a lab step beside torch's (benchmarks/versus.py).

    stage_modules(stage)        a lab PipelineStage's own modules as one nn.Module, for torch's PipelineStage
    mean_loss(out, target)      the lab's loss, in the form torch's schedules take
"""
from __future__ import annotations


def stage_modules(stage):
    """A lab PipelineStage's own modules as one nn.Module, for torch's PipelineStage (no checks, no tracing)."""
    from torch import nn

    class Piece(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.blocks, self.head = stage.embed, stage.blocks, stage.head

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks.values():
                x = block(x)
            return self.head(x) if self.head is not None else x

    return Piece()


def mean_loss(out, target):
    """The loss torch's schedule backpropagates: the output's mean, the lab's loss (q04's baseline takes it too)."""
    return out.mean()
