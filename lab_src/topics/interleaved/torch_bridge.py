"""The lab's stages under torch.distributed.pipelining's own schedules: the bridge from the exercises to the
production API (the notebooks' `torch_bridge()`, topics/interleaved/kind_torch.py) and the benchmarks that
time a lab step beside torch's (benchmarks/versus.py).

    stage_modules(stage)        a lab PipelineStage's own modules as one nn.Module, for torch's PipelineStage
    chunk_modules(stage, c)     chunk c of a lab InterleavedStage as one nn.Module (ScheduleInterleaved1F1B)
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


def chunk_modules(stage, c: int):
    """Chunk `c` of a lab InterleavedStage as one nn.Module, for torch's PipelineStage of its virtual stage."""
    from torch import nn

    class Chunk(nn.Module):
        def __init__(self):
            super().__init__()
            s = stage.virtual_stage(c)
            self.embed = stage.embed if s == 0 else None
            self.blocks = nn.ModuleList(stage.blocks[str(i)] for i in stage.chunk_layers[c])
            self.head = stage.head if s == stage.num_virtual_stages - 1 else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x) if self.head is not None else x

    return Chunk()


def mean_loss(out, target):
    """The loss torch's schedule backpropagates: the output's mean, the lab's loss (q04's baseline takes it too)."""
    return out.mean()
