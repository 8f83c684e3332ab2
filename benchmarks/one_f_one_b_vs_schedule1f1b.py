"""Benchmark: the lab's reference 1F1B step (q12 on q11's raw torch.distributed calls) beside
torch.distributed.pipelining's Schedule1F1B.

Same model (the lab's stages), same configuration, same batch, same processes, in one torchrun launch
(benchmarks/versus.py). Each iteration times three steps in rotating order after warm-up: ours as the
checks run it (every torch.distributed message recorded by comm/messages.py, every operation traced and
journalled, the activation memory counted), ours untraced, and Schedule1F1B's. A step's time is the
slowest rank's, between two barriers. Prints the median step times and the ratios ours / Schedule1F1B
(the target is at most 1.0). Both schedules' gradients are compared once, as a sanity check.

    python benchmarks/one_f_one_b_vs_schedule1f1b.py [--steps 30] [--stages 4] [--microbatches 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import versus  # noqa: E402


def contenders(spec: dict, ctx) -> versus.Contenders:
    from torch.distributed.pipelining import Schedule1F1B

    from lab_src.comm import messages as msgs
    from lab_src.exercises import one_f_one_b_step
    from lab_src.harness.memory import counting
    from lab_src.pipeline import trace

    msgs.install()                           # as in the checks' processes
    stage, micro_batches, theirs = versus.one_stage_per_rank(spec, ctx, Schedule1F1B)
    tracer = versus.journal_tracer(spec, ctx.rank)
    m = len(micro_batches)

    def ours(traced=True):
        data = iter(micro_batches) if ctx.rank == 0 else None
        if traced:
            with trace.tracing(tracer), counting(stage, tracer):
                one_f_one_b_step(stage, data, m)
            tracer.events.clear()
        else:
            one_f_one_b_step(stage, data, m)

    return versus.Contenders(stage, ours, theirs)


def main() -> int:
    from lab_src.pipeline.config import DEMO

    args = versus.arguments(__doc__, steps=30, out="bench-1f1b").parse_args()
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches)
    return versus.race("benchmarks.one_f_one_b_vs_schedule1f1b", args, cfg, what=cfg.describe(),
                       theirs="Schedule1F1B",
                       labels={"ours": "lab reference 1F1B, traced as in the checks",
                               "ours_untraced": "lab reference 1F1B, not traced", "theirs": "Schedule1F1B"})


if __name__ == "__main__":
    sys.exit(versus.run(contenders, main))
