"""q23's reference `recompute_block` against torch's own recomputation on the lab's block (dropout on, training mode):
`torch.utils.checkpoint.checkpoint` of the whole block (full), and its selective policy,
`create_selective_checkpoint_contexts`, in two forms: every op's output saved but the attention core's (the literal
reading of "recompute the core"), and only the linear layers' and LayerNorms' outputs saved (the rest recomputed).
torch's variants are given the block's generators replayed as the reference replays them (else their gradients are
another network's: the block's dropout draws from its own generators, which preserve_rng_state does not restore);
`torch, no replay` is torch's checkpoint as it comes, for its cost alone.

Per shape and dtype, per variant: the bytes the forward leaves alive for the backward (the lab's count,
topics/long_sequences/measure.py `kept`) and their ratio to the plain block's, the matmul FLOPs of a forward and
backward (torch.utils.flop_counter) against the plain block's, the median time of a forward and backward over
`--steps` runs and its ratio to the plain block's, whether the gradients are bitwise the plain block's, and the ratio
of the reference's time to torch's variant of the same mode (target about 1.0).

    .venv/bin/python benchmarks/recompute_vs_torch.py [--steps 10] [--threads 1]

It asserts nothing.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [(4, 256, 64, 8, "bfloat16"), (4, 256, 64, 8, "float32"), (2, 512, 128, 8, "float32")]


def reference():
    from grader.reference import reference_sources
    path = reference_sources()["q23"]
    module = types.ModuleType("q23_reference")
    exec(compile(Path(path).read_text(), str(path), "exec"), module.__dict__)
    return module


def variants(ref):
    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    core_ops = {aten.bmm.default, aten._softmax.default, aten.masked_fill.Scalar, aten.div.Tensor, aten.mul.Tensor}
    saved_ops = {aten.addmm.default, aten.native_layer_norm.default}

    class Torch(torch.nn.Module):
        def __init__(self, block, policy=None, replay=True):
            super().__init__()
            self.block, self.policy, self.replay = block, policy, replay

        def forward(self, x):
            fn = ref._replayed(self.block, ref._generators(self.block)) if self.replay else self.block
            if self.policy is None:
                return checkpoint(fn, x, use_reentrant=False)
            return checkpoint(fn, x, use_reentrant=False,
                              context_fn=lambda: create_selective_checkpoint_contexts(self.policy))

    def all_but_core(ctx, op, *args, **kwargs):
        return CheckpointPolicy.PREFER_RECOMPUTE if op in core_ops else CheckpointPolicy.MUST_SAVE

    def linear_and_norms(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in saved_ops else CheckpointPolicy.PREFER_RECOMPUTE

    return {
        "plain": ("none", lambda b: b),
        "reference none": ("none", lambda b: ref.recompute_block(b, "none")),
        "reference selective": ("selective", lambda b: ref.recompute_block(b, "selective")),
        "torch SAC, all but the core saved": ("selective", lambda b: Torch(b, all_but_core)),
        "torch SAC, linears + norms saved": ("selective", lambda b: Torch(b, linear_and_norms)),
        "reference full": ("full", lambda b: ref.recompute_block(b, "full")),
        "torch checkpoint": ("full", lambda b: Torch(b)),
        "torch, no replay": ("full", lambda b: Torch(b, replay=False)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    import torch

    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.long_sequences.measure import DTYPES, flops, kept, make_block, sequence
    from lab_src.topics.long_sequences.records import ITEMSIZE, kept_bytes
    torch.set_num_threads(args.threads)
    ref = reference()
    table = variants(ref)
    for b, s, h, a, dtype in SHAPES:
        cfg = LabConfig(hidden_size=h, num_heads=a, seq_len=s, dropout=0.1, seed=5, num_stages=1)
        g = torch.Generator().manual_seed(7)
        xs = [torch.randn(b, s, h, generator=g).to(DTYPES[dtype]) for _ in range(3)]
        print(f"\nb={b} s={s} h={h} a={a} {dtype}, dropout 0.1, {args.threads} thread(s), median of {args.steps} "
              f"forward+backward; closed form (records.py): none {kept_bytes(b, s, h, a, ITEMSIZE[dtype], 'none'):,} "
              f"selective {kept_bytes(b, s, h, a, ITEMSIZE[dtype], 'selective'):,} "
              f"full {kept_bytes(b, s, h, a, ITEMSIZE[dtype], 'full'):,} B")
        print(f"  {'variant':<36} {'kept (B)':>12} {'/plain':>7} {'FLOPs':>13} {'/plain':>7} {'ms':>8} {'/plain':>7} "
              f"{'bitwise':>8}")
        block = make_block(cfg, dtype)
        plain_run = sequence(block, block, xs)
        rows = {}
        for name, (mode, make) in table.items():
            block = make_block(cfg, dtype)
            k = kept(make(block), xs[0].clone().requires_grad_(), known=list(block.parameters()))["bytes"]
            f = flops(make(make_block(cfg, dtype)), xs[0].clone().requires_grad_())
            times = []
            block = make_block(cfg, dtype)
            module = make(block)
            for _ in range(args.steps):
                x = xs[0].clone().requires_grad_()
                t0 = time.perf_counter()
                module(x).float().sum().backward()
                times.append(time.perf_counter() - t0)
            block = make_block(cfg, dtype)
            run = sequence(make(block), block, xs)
            same = all(torch.equal(u, v) for key in ("outputs", "input_grads") for u, v in zip(run[key], plain_run[key])) \
                and all(torch.equal(run["grads"][n], w) for n, w in plain_run["grads"].items())
            rows[name] = (k, f["forward"] + f["backward"], statistics.median(times), same)
        base = rows["plain"]
        for name, (k, fl, t, same) in rows.items():
            print(f"  {name:<36} {k:>12,} {k / base[0]:>7.3f} {fl:>13,} {fl / base[1]:>7.3f} {1e3 * t:>8.1f} "
                  f"{t / base[2]:>7.2f} {'yes' if same else 'NO':>8}")
        for mine, theirs in (("reference selective", "torch SAC, all but the core saved"),
                             ("reference selective", "torch SAC, linears + norms saved"),
                             ("reference full", "torch checkpoint")):
            print(f"  {mine} / {theirs}: kept {rows[mine][0] / rows[theirs][0]:.3f}, "
                  f"time {rows[mine][2] / rows[theirs][2]:.2f}")


if __name__ == "__main__":
    main()
