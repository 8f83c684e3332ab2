"""q26's mixed-precision FSDP layer against FSDP2's `fully_shard` with `MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=float32)`: a stack of the lab's blocks (no embedding or head: the input is a float32 activation), each
wrapped by the reference `mixed_precision_layer` (float32 master shards, the cast gathered, the block in bf16, the
gradient cast to float32 before the reduce-scatter; the lab's gloo collectives, topics/mixed_precision/group.py,
`ring` None), beside the same blocks with `fully_shard` and the policy on every block; 2 and 4 data-parallel ranks
(gloo, one thread each), SGD, the same weights and batches. Per configuration it prints the parameters' largest
difference after the steps against each other and against a float32 run of the same blocks (how far mixed precision
moves the weights), the bytes of one block's gather (ours: the tensor our gather returned; fully_shard: the
all-gather's output, read from its parameters' dtype), the median step time (the slowest rank's) and the ratio
ours / fully_shard.

    .venv/bin/python benchmarks/mixed_precision_vs_torch.py [--ranks 2 4] [--steps 10]

It asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BLOCKS, HIDDEN, HEADS, SEQ, BATCH = 4, 64, 4, 32, 4
LR = 0.05


def worker(rank: int, n: int, init: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from lab_src import exercises
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.mixed_precision import model as lab_model
    from lab_src.topics.mixed_precision.group import MixedGroup
    from lab_src.topics.mixed_precision.records import MixedSettings
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    cfg = LabConfig(hidden_size=HIDDEN, num_heads=HEADS, seq_len=SEQ, num_stages=1, seed=7)
    s = MixedSettings(dtype="bfloat16", blocks=BLOCKS, batch=BATCH)
    dp = MixedGroup(dist.group.WORLD, list(range(n)), rank)
    ours = []
    for block in lab_model.blocks(cfg, s):
        total = sum(p.numel() for p in block.parameters())
        module = exercises.mixed_precision_layer(block, dp, torch.bfloat16)
        dp.register(block.name, module.shard, total)
        ours.append(module)
    theirs = torch.nn.Sequential(*lab_model.blocks(cfg, s))
    plain = torch.nn.Sequential(*lab_model.blocks(cfg, s))          # float32 throughout, replicated
    mesh = init_device_mesh("cpu", (n,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in theirs:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(theirs, mesh=mesh, mp_policy=policy)
    sgd_ours = torch.optim.SGD([m.shard for m in ours], lr=LR)
    sgd_theirs = torch.optim.SGD(theirs.parameters(), lr=LR)
    sgd_plain = torch.optim.SGD(plain.parameters(), lr=LR)

    def step(name, k):
        x, target = lab_model.batch(cfg, s, k, rank)
        if name == "ours":
            h = x
            for m in ours:
                h = m(h)
            lab_model.loss_of(h, target).backward()
            sgd_ours.step()
        elif name == "theirs":
            lab_model.loss_of(theirs(x), target).backward()
            sgd_theirs.step()
        else:
            lab_model.loss_of(plain(x), target).backward()
            for p in plain.parameters():
                dist.all_reduce(p.grad)
                p.grad /= n
            sgd_plain.step()

    times = {"ours": [], "theirs": [], "plain": []}
    gather_bytes = 0
    for k in range(steps + 2):
        for name, opt in (("ours", sgd_ours), ("theirs", sgd_theirs), ("plain", sgd_plain)):
            opt.zero_grad(set_to_none=True)
            dp.new_step()
            dist.barrier()
            t0 = time.perf_counter()
            step(name, k)
            dist.barrier()
            if k >= 2:
                times[name].append(time.perf_counter() - t0)
            if name == "ours":
                gather_bytes = dp.gathers[0][2]
    diff_theirs = diff_plain = 0.0
    for module, tb, pb in zip(ours, theirs, plain):
        full = dp.gather_raw(module.shard.detach())
        t = torch.cat([p.full_tensor().detach().reshape(-1) for p in tb.parameters()])
        q = torch.cat([p.detach().reshape(-1) for p in pb.parameters()])
        diff_theirs = max(diff_theirs, float((full - t).abs().max()))
        diff_plain = max(diff_plain, float((full - q).abs().max()))
    theirs_gather = sum(p.numel() for p in theirs[0].parameters()) * 2     # a DTensor counts its whole shape: bf16 bytes
    result = {"diff_theirs": diff_theirs, "diff_plain": diff_plain, "gather": gather_bytes,
              "theirs_gather": theirs_gather, "ours": statistics.median(times["ours"]),
              "theirs": statistics.median(times["theirs"]), "plain": statistics.median(times["plain"])}
    gathered = [None] * n
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    ours = theirs = plain = mesh = None
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from benchmarks.ring_all_reduce import with_reference_answers
    block = 12 * HIDDEN * HIDDEN + 13 * HIDDEN
    print(f"q26's mixed_precision_layer (reference) against FSDP2's fully_shard with MixedPrecisionPolicy(param_dtype="
          f"bf16, reduce_dtype=float32): {BLOCKS} blocks of hidden {HIDDEN} (about {block:,} parameters each), SGD, "
          f"gloo, one thread per rank, {os.cpu_count()} cores; median of {args.steps} steps")
    print(f"  {'ranks':>5} {'gather ours (B)':>16} {'fully_shard (B)':>16} {'ours (ms)':>10} {'fully_shard (ms)':>17} "
          f"{'float32 DDP (ms)':>17} {'ours / fully_shard':>19} {'diff vs fully_shard':>20} {'diff vs float32':>16}")
    with with_reference_answers():
        for n in args.ranks:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "out")
                mp.spawn(worker, args=(n, f"file://{tmp}/store", args.steps, out), nprocs=n)
                got = json.loads(Path(out).read_text())
            slow = {k: max(g[k] for g in got) for k in ("ours", "theirs", "plain")}
            print(f"  {n:>5} {got[0]['gather']:>16,} {got[0]['theirs_gather']:>16,} {slow['ours'] * 1e3:>10.1f} "
                  f"{slow['theirs'] * 1e3:>17.1f} {slow['plain'] * 1e3:>17.1f} {slow['ours'] / slow['theirs']:>19.2f} "
                  f"{max(g['diff_theirs'] for g in got):>20.2e} {max(g['diff_plain'] for g in got):>16.2e}")


if __name__ == "__main__":
    main()
