"""Benchmark: the lab's reference ZB-H1 step (q16, with its reference backward_input and backward_weight)
beside torch.distributed.pipelining's ScheduleInterleavedZeroBubble with one stage per rank (torch's ZB1P:
the same program, its split backward in torch/distributed/pipelining/_backward.py).

Same model (the lab's stages), same configuration, same batch, same processes, in one torchrun launch
(benchmarks/versus.py). Each iteration times three steps in rotating order after warm-up: ours as the
checks run it (every operation traced and journalled, the activation memory counted), ours untraced, and
ScheduleInterleavedZeroBubble's. A step's time is the slowest rank's, between two barriers; its CPU the sum
of the ranks'. Prints the median step times and the ratios ours / ScheduleInterleavedZeroBubble (the target
is at most 1.0). Both schedules' gradients are compared once, as a sanity check. The bubbles of 1F1B and
ZB-H1 against m: benchmarks/zero_bubble_bubbles.py.

    python benchmarks/zero_bubble_vs_torch.py [--steps 20] [--stages 4] [--microbatches 8]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import versus  # noqa: E402


def contenders(spec: dict, ctx) -> versus.Contenders:
    from torch.distributed.pipelining import ScheduleInterleavedZeroBubble

    from lab_src.exercises import zero_bubble_step
    from lab_src.harness.memory import counting
    from lab_src.pipeline import split, trace

    def zb1p(stage, **kwargs):             # one stage per rank: a list of one
        return ScheduleInterleavedZeroBubble([stage], **kwargs)

    stage, micro_batches, theirs = versus.one_stage_per_rank(spec, ctx, zb1p)
    split.warm_up()
    tracer = versus.journal_tracer(spec, ctx.rank)
    m = len(micro_batches)

    def ours(traced=True):
        data = iter(micro_batches) if ctx.rank == 0 else None
        if traced:
            with trace.tracing(tracer), counting(stage, tracer):
                zero_bubble_step(stage, data, m)
            tracer.events.clear()
        else:
            zero_bubble_step(stage, data, m)
        stage.flush()

    return versus.Contenders(stage, ours, theirs)


def main() -> int:
    from lab_src.pipeline.config import DEMO

    args = versus.arguments(__doc__, steps=20, out="bench-zero-bubble").parse_args()
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches)
    return versus.race("benchmarks.zero_bubble_vs_torch", args, cfg, what=cfg.describe(),
                       theirs="ScheduleInterleavedZeroBubble",
                       labels={"ours": "lab reference ZB-H1, traced as in the checks",
                               "ours_untraced": "lab reference ZB-H1, not traced",
                               "theirs": "ScheduleInterleavedZeroBubble (one stage per rank)"}, cpu=True, fastest=True)


if __name__ == "__main__":
    sys.exit(versus.run(contenders, main))
