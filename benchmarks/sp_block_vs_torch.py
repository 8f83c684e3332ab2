"""Benchmark: the lab's reference sequence-parallel block (q23's sp_block: LayerNorms and residuals on each rank's
positions, an all-gather before qkv and up, a reduce-scatter after proj and down, column layers that keep their shard
and gather it again in the backward, raw dist.all_gather_single / reduce_scatter_single) beside
torch.distributed.tensor.parallel's `parallelize_module` on the same block with Megatron's plan: `SequenceParallel` on
the two LayerNorms, `ColwiseParallel(input_layouts=Shard(1))` on q, k, v (the fused qkv cut into its three projections)
and on up, `RowwiseParallel(output_layouts=Shard(1))` on proj and down, on a CPU device mesh of t ranks (gloo).

One torchrun launch; every rank builds both from the same unsharded block (the demo model's: hidden 256, 8 heads)
and feeds both its positions of the same batch, dropout off. One forward and backward of each is compared first
(this rank's positions of the output and of the input's gradient, the shard gradients of q, k, v, proj, up, down,
and the LayerNorms' gradients, summed over the ranks: they must be equal). Then, after warm-up, each iteration times
three steps in rotating order: ours as the checks run it (every collective recorded, comm/collectives.py), ours
unrecorded, and torch's; a step is a forward and a backward from zero gradients, its time the slowest rank's
between two barriers. Prints the median step times (min, max) and the ratios ours / torch's (target at most 1.0).

    python benchmarks/sp_block_vs_torch.py [--ranks 2] [--steps 30] [--batch 8]
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
    import copy

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    from lab_src.answers import use_answers
    from lab_src.comm import collectives as coll
    from lab_src.harness import groups as distributed
    from lab_src.pipeline import trace
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_piece
    from lab_src.topics.long_sequences.kind_sp import sp_function
    from lab_src.topics.long_sequences.shards import BLOCK, TensorParallel

    spec = json.loads(Path(spec_path).read_text())
    ctx = distributed.init(120)
    coll.install()
    cfg = LabConfig.from_dict(spec["config"])
    t, r = ctx.world_size, ctx.rank
    h, heads, s = cfg.hidden_size, cfg.num_heads, cfg.seq_len
    tp = TensorParallel(r, t, dist.group.WORLD, ctx.device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(spec["batch"], s, h, generator=gen).chunk(t, 1)[r].contiguous()
    grad = torch.randn(spec["batch"], s, h, generator=gen).chunk(t, 1)[r].contiguous()
    block = build_piece(cfg, BLOCK)

    class TorchBlock(nn.Module):
        """The block with its fused qkv cut into q, k, v: what ColwiseParallel can shard by heads."""

        def __init__(self):
            super().__init__()
            self.attn_norm, self.mlp_norm = copy.deepcopy(block.attn_norm), copy.deepcopy(block.mlp_norm)
            self.q, self.k, self.v = (nn.Linear(h, h) for _ in range(3))
            with torch.no_grad():
                for i, lin in enumerate((self.q, self.k, self.v)):
                    lin.weight.copy_(block.qkv.weight[i * h:(i + 1) * h])
                    lin.bias.copy_(block.qkv.bias[i * h:(i + 1) * h])
            self.proj, self.up, self.down = (copy.deepcopy(m) for m in (block.proj, block.up, block.down))
            self.local_heads = heads // t

        def forward(self, inp):
            b = inp.shape[0]
            n = self.attn_norm(inp)
            q, k, v = (lin(n).view(b, s, self.local_heads, -1).transpose(1, 2) for lin in (self.q, self.k, self.v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1)
            inp = inp + self.proj(a)
            return inp + self.down(F.gelu(self.up(self.mlp_norm(inp))))
    mesh = init_device_mesh("cpu", (t,))
    column, row = ColwiseParallel(input_layouts=Shard(1)), RowwiseParallel(output_layouts=Shard(1))
    theirs = parallelize_module(TorchBlock(), mesh, {"attn_norm": SequenceParallel(), "mlp_norm": SequenceParallel(),
                                                     "q": column, "k": column, "v": column, "proj": row,
                                                     "up": column, "down": row})
    with use_answers(spec["answers"]):
        ours = sp_function()(build_piece(cfg, BLOCK), tp)
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

    def whole(v):
        """A replicated parameter's gradient: DTensor's as it holds it (full_tensor); ours is summed already."""
        return v.full_tensor() if hasattr(v, "full_tensor") else v

    o1, g1 = step(ours, True)
    o2, g2 = step(theirs)
    # ours: this rank's q rows, then its k rows, then its v rows: torch's three local shards, one after the other
    qkv_grad = torch.cat([local(lin.weight.grad) for lin in (theirs.q, theirs.k, theirs.v)])
    diffs = [(o1 - local(o2)).abs().max(), (g1 - local(g2)).abs().max(),
             (ours.qkv.weight.grad - qkv_grad).abs().max(),
             (ours.proj.weight.grad - local(theirs.proj.weight.grad)).abs().max(),
             (ours.up.weight.grad - local(theirs.up.weight.grad)).abs().max(),
             (ours.down.weight.grad - local(theirs.down.weight.grad)).abs().max(),
             (ours.attn_norm.weight.grad - whole(theirs.attn_norm.weight.grad)).abs().max(),
             (ours.down.bias.grad - whole(theirs.down.bias.grad)).abs().max()]
    if r == 0:
        print("largest differences (out, in_grad, qkv, proj, up, down, attn_norm.weight, down.bias):",
              [f"{float(d):.1e}" for d in diffs], flush=True)
    times = time_in_turn((lambda: step(ours, True), lambda: step(ours), lambda: step(theirs)),
                         spec["warmup"], spec["steps"])
    finish(spec, times, diffs)


def main() -> int:
    from grader.reference import reference_sources
    from lab_src.pipeline.config import DEMO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench-sp-block")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = {"config": DEMO.to_dict(), "answers": reference_sources(), "steps": args.steps, "warmup": args.warmup,
            "batch": args.batch, "out": str(out / "times.json")}
    h, s = DEMO.hidden_size, DEMO.seq_len
    print(f"the block (hidden {h}, {DEMO.num_heads} heads) on t = {args.ranks} ranks (gloo, CPU), input "
          f"({args.batch}, {s}, {h}) float32, each rank its {s // args.ranks} positions; {args.steps} timed "
          f"forward+backward steps of each, alternating, after {args.warmup} warm-up", flush=True)
    labels = {"ours": "lab reference q23 sp_block, collectives recorded",
              "ours_unrecorded": "lab reference q23 sp_block, not recorded",
              "theirs": "parallelize_module(SequenceParallel norms, Colwise/Rowwise Shard(1))"}
    return launch_and_report("benchmarks.sp_block_vs_torch", args.ranks, spec, out, labels)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        os._exit(0)
    sys.exit(main())
