"""Benchmark: the lab's reference tensor-parallel MLP (q17: CopyToTensorParallel, ColumnParallelLinear,
gelu, RowParallelLinear, ReduceFromTensorParallel, on raw dist.all_reduce) beside
torch.distributed.tensor.parallel's `parallelize_module` with `ColwiseParallel` on `up` and
`RowwiseParallel` on `down`, on a CPU device mesh of t ranks.

One torchrun launch; every rank builds both from the same unsharded block MLP (the demo model's: hidden 256,
so `up` is 256 -> 1024) and feeds both the same batch. One forward and backward of each is compared first
(outputs, input gradients and every rank's weight-shard gradients: the numbers must be equal). Then, after
warm-up, each iteration times three steps in rotating order: ours as the checks run it (every collective
recorded, comm/collectives.py), ours unrecorded, and torch's; a step is a forward and a backward from zero
gradients, its time the slowest rank's between two barriers. Prints the median step times (min, max) and the
ratios ours / torch's (target at most 1.0).

    python benchmarks/tp_vs_torch.py [--ranks 2] [--steps 50] [--batch 8]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tp_timing import finish, launch_and_report, time_in_turn  # noqa: E402


def worker(spec_path: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from lab_src.answers import use_answers
    from lab_src.comm import collectives as coll
    from lab_src.exercises import tp_layers
    from lab_src.harness import groups as distributed
    from lab_src.pipeline import trace
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.tensor_parallel.runtime import TensorParallel, full_mlp, shard

    spec = json.loads(Path(spec_path).read_text())
    ctx = distributed.init(120)
    coll.install()
    cfg = LabConfig.from_dict(spec["config"])
    t, r = ctx.world_size, ctx.rank
    tp = TensorParallel(r, t, dist.group.WORLD, ctx.device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(spec["batch"], cfg.seq_len, cfg.hidden_size, generator=gen)
    grad = torch.randn(x.shape, generator=gen)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = full_mlp(cfg)

        def forward(self, h):
            return self.down(F.gelu(self.up(h)))
    mesh = init_device_mesh("cpu", (t,))
    theirs = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    with use_answers(spec["answers"]):
        up, down = full_mlp(cfg)
        ours = tp_layers(up, down, tp)
    tracer = trace.Tracer(r)

    def step(model, recorded: bool = False):
        model.zero_grad(set_to_none=True)
        inp = x.clone().requires_grad_()
        if recorded:
            with trace.tracing(tracer):
                out = model(inp)
                out.backward(grad)
            tracer.events.clear()
        else:
            out = model(inp)
            out.backward(grad)
        return out, inp.grad

    def local(v):
        return v.to_local() if hasattr(v, "to_local") else v

    o1, g1 = step(ours, True)
    o2, g2 = step(theirs)
    diffs = [(o1 - local(o2)).abs().max(), (g1 - g2).abs().max(),
             (ours.up.weight.grad - local(theirs.up.weight.grad)).abs().max(),
             (ours.down.weight.grad - local(theirs.down.weight.grad)).abs().max(),
             (ours.up.bias.grad - local(theirs.up.bias.grad)).abs().max(),
             (ours.down.bias.grad - local(theirs.down.bias.grad)).abs().max(),
             (ours.up.weight - shard(up.weight.detach(), r, t, 0)).abs().max()]
    times = time_in_turn((lambda: step(ours, True), lambda: step(ours), lambda: step(theirs)),
                         spec["warmup"], spec["steps"])
    finish(spec, times, diffs)


def main() -> int:
    from grader.reference import reference_sources
    from lab_src.pipeline.config import DEMO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench-tp")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = {"config": DEMO.to_dict(), "answers": reference_sources(), "steps": args.steps, "warmup": args.warmup,
            "batch": args.batch, "out": str(out / "times.json")}
    h, s = DEMO.hidden_size, DEMO.seq_len
    print(f"the block MLP {h} -> {4 * h} -> {h} on t = {args.ranks} ranks (gloo, CPU), input ({args.batch}, {s}, {h}) "
          f"float32; {args.steps} timed forward+backward steps of each, alternating, after {args.warmup} warm-up",
          flush=True)
    labels = {"ours": "lab reference q17, collectives recorded", "ours_unrecorded": "lab reference q17, not recorded",
              "theirs": "parallelize_module(ColwiseParallel, RowwiseParallel)"}
    return launch_and_report("benchmarks.tp_vs_torch", args.ranks, spec, out, labels)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        os._exit(0)
    sys.exit(main())
