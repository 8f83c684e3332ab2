"""Benchmark: the lab's reference interleaved step (q15) beside torch.distributed.pipelining's
ScheduleInterleaved1F1B.

Same model chunks (each rank's `InterleavedStage` modules, shared with torch's stages), same configuration,
same batch, same processes, in one torchrun launch (benchmarks/versus.py). Each iteration times three steps
in rotating order after warm-up: ours as the checks run it (every operation traced and journalled), ours
untraced, and ScheduleInterleaved1F1B's. A step's time is the slowest rank's, between two barriers; its CPU
is the sum of the ranks' process CPU time during the step (their communication threads included): where
ranks share cores, as 4 ranks on a laptop's 2 do, CPU decides the step time. Prints the median step times
and CPU and the ratios ours / ScheduleInterleaved1F1B (the target is at most 1.0). Both schedules'
gradients are compared once, as a sanity check.

    python benchmarks/interleaved_vs_torch.py [--steps 20] [--stages 4] [--chunks 2] [--microbatches 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import versus  # noqa: E402


def contenders(spec: dict, ctx) -> versus.Contenders:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    from lab_src.exercises import check_args, interleaved_step
    from lab_src.pipeline import trace
    from lab_src.topics.interleaved.chunked import InterleavedStage
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.topics.interleaved.torch_bridge import chunk_modules

    cfg = LabConfig.from_dict(spec["config"])
    rank, p, m, v = ctx.rank, cfg.num_stages, cfg.num_microbatches, spec["chunks"]

    mbs = check_args(cfg.num_layers, p, cfg.global_batch_size, m)
    stage = InterleavedStage(cfg, rank, p, v, mbs, ctx.device, dist.group.WORLD)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    torch_stages = [TorchStage(chunk_modules(stage, c), stage.virtual_stage(c), v * p, ctx.device) for c in range(v)]
    theirs = ScheduleInterleaved1F1B(torch_stages, n_microbatches=m, loss_fn=versus.mean_loss)
    tracer = versus.journal_tracer(spec, rank)
    micro_batches = list(batch.chunk(m))   # both schedules get the same batch, already loaded

    def ours(traced=True):
        data = iter(micro_batches) if rank == 0 else None
        if traced:
            with trace.tracing(tracer):
                interleaved_step(stage, data, m)
            tracer.events.clear()
        else:
            interleaved_step(stage, data, m)
        stage.flush()

    return versus.Contenders(stage, ours, versus.torch_step(theirs, rank, p, batch, torch.zeros(cfg.global_batch_size)))


def main() -> int:
    from lab_src.pipeline.config import DEMO

    ap = versus.arguments(__doc__, steps=20, out="bench-interleaved")
    ap.add_argument("--chunks", type=int, default=2)
    args = ap.parse_args()
    # every virtual stage gets a whole block: at least chunks * stages blocks
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches,
                       num_layers=max(DEMO.num_layers, args.chunks * args.stages))
    return versus.race("benchmarks.interleaved_vs_torch", args, cfg, extra={"chunks": args.chunks},
                       what=f"{cfg.describe()}, {args.chunks} chunks per rank", theirs="ScheduleInterleaved1F1B",
                       labels={"ours": "lab reference interleaved, traced as in checks",
                               "ours_untraced": "lab reference interleaved, not traced",
                               "theirs": "ScheduleInterleaved1F1B"}, cpu=True, fastest=True)


if __name__ == "__main__":
    sys.exit(versus.run(contenders, main))
