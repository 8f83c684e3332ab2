"""Benchmark: the lab's reference AFAB step beside torch.distributed.pipelining's ScheduleGPipe.

Same model (the lab's stages), same configuration, same batch, same processes, in one torchrun launch
(benchmarks/versus.py). Each iteration times three steps in rotating order after warm-up: ours as the
checks run it (every operation traced and journalled, every wait one the check can stop:
pipeline/waiting.py), ours untraced with plain waits, and ScheduleGPipe's. A step's time is the slowest
rank's, between two barriers. Prints the median step times and the ratios ours / ScheduleGPipe (the
target is at most 1.0). Both schedules' gradients are compared once, as a sanity check.

    python benchmarks/afab_vs_gpipe.py [--steps 30] [--stages 4] [--microbatches 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import versus  # noqa: E402


def contenders(spec: dict, ctx) -> versus.Contenders:
    from torch.distributed.pipelining import ScheduleGPipe

    from lab_src.exercises import afab_step
    from lab_src.pipeline import trace, waiting

    stage, micro_batches, theirs = versus.one_stage_per_rank(spec, ctx, ScheduleGPipe)
    tracer = versus.journal_tracer(spec, ctx.rank)
    m = len(micro_batches)

    def ours(traced=True):
        data = iter(micro_batches) if ctx.rank == 0 else None
        if traced:
            with trace.tracing(tracer), waiting.stop_when(lambda: None):
                afab_step(stage, data, m)
                stage.flush()
            tracer.events.clear()
        else:
            afab_step(stage, data, m)
        stage.flush()

    return versus.Contenders(stage, ours, theirs)


def main() -> int:
    from lab_src.pipeline.config import DEMO

    args = versus.arguments(__doc__, steps=30, out="bench").parse_args()
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches)
    return versus.race("benchmarks.afab_vs_gpipe", args, cfg, what=cfg.describe(), theirs="ScheduleGPipe",
                       labels={"ours": "lab reference AFAB, traced as in the checks",
                               "ours_untraced": "lab reference AFAB, not traced", "theirs": "ScheduleGPipe"})


if __name__ == "__main__":
    sys.exit(versus.run(contenders, main))
