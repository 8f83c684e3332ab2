"""q21's sharded AdamW step against torch's ZeroRedundancyOptimizer on the same model: the reference
`sharded_adamw_step` (reduce-scatter and all-gather in a ring of point-to-point messages, AdamW on the rank's
shard) after a plain forward and backward, beside `DistributedDataParallel` (its bucketed all-reduce in the
backward) with `ZeroRedundancyOptimizer(AdamW)` (the optimizer state sharded by whole parameters, each rank's
updated parameters broadcast), and beside DDP with a full AdamW on every rank; on 2 and 4 data-parallel ranks
(gloo, one thread each). All three start from the same weights and read the same shards; per configuration it
prints the parameters' largest difference after the steps (a sanity check), the optimizer state each rank holds
(bytes), the median time of a whole step (forward, backward, reduction, optimizer: the slowest rank's, between two
barriers) and the ratio to ZeroRedundancyOptimizer's (target at most 1.0).

    .venv/bin/python benchmarks/zero_vs_torch.py [--ranks 2 4] [--steps 20]

The ring's messages are untraced here (no check records them). It asserts nothing.
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

CFG = dict(num_layers=8, hidden_size=128, num_heads=4, seq_len=32, vocab_size=256, num_microbatches=1, num_stages=1)
LR = 0.01


def state_bytes(opt_state) -> int:
    from lab_src.topics.sharding.kind import held_bytes
    return held_bytes(opt_state)[0]


def worker(rank: int, n: int, init: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    from lab_src import exercises
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    from lab_src.topics.sharding.kind import DataParallelGroup
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    cfg = LabConfig(**CFG, dp_size=n, global_batch_size=8 * n)
    x = next(iter(make_dataloader(cfg, 8, dp_rank=rank)))
    ours, zmodel, fmodel = (build_model(cfg, "cpu") for _ in range(3))
    dp = DataParallelGroup(dist.group.WORLD, list(range(n)), rank)
    state: dict = {}
    zddp, fddp = DistributedDataParallel(zmodel), DistributedDataParallel(fmodel)
    zero = ZeroRedundancyOptimizer(zmodel.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
    full = torch.optim.AdamW(fmodel.parameters(), lr=LR)

    def step_ours():
        ours(x).mean().backward()
        with torch.no_grad():
            exercises.sharded_adamw_step(list(ours.parameters()), dp, state, LR)

    def step_zero():
        zddp(x).mean().backward()
        zero.step()

    def step_full():
        fddp(x).mean().backward()
        full.step()

    times = {"ours": [], "zero": [], "full": []}
    for k in range(steps + 2):
        for name, fn, model in (("ours", step_ours, ours), ("zero", step_zero, zmodel), ("full", step_full, fmodel)):
            for p in model.parameters():
                p.grad = None
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            if k >= 2:
                times[name].append(time.perf_counter() - t0)
    diff = max(max(float((a - b).detach().abs().max()), float((a - c).detach().abs().max()))
               for a, b, c in zip(ours.parameters(), zmodel.parameters(), fmodel.parameters()))
    held = {"ours": state_bytes(state), "zero": state_bytes(zero.optim.state), "full": state_bytes(full.state)}
    result = {"diff": diff, "held": held, **{k: statistics.median(v) for k, v in times.items()}}
    gathered = [None] * n
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from benchmarks.ring_all_reduce import with_reference_answers
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_model
    params = sum(p.numel() for p in build_model(LabConfig(**CFG), "cpu").parameters())
    print(f"q21's sharded AdamW step (reference) against ZeroRedundancyOptimizer(AdamW) and a full AdamW after an "
          f"all-reduce: the lab's model, {CFG['num_layers']} blocks, hidden {CFG['hidden_size']}, {params:,} float32 "
          f"parameters (AdamW's whole state {8 * params:,} B); gloo, one thread per rank, {os.cpu_count()} cores; "
          f"median of {args.steps} whole steps")
    print(f"  {'ranks':>5} {'state/rank: ours (B)':>21} {'ZeRO (B)':>20} {'full (B)':>10} {'ours (ms)':>10} "
          f"{'ZeRO (ms)':>10} {'full (ms)':>10} {'ours / ZeRO':>12} {'largest diff':>13}")
    with with_reference_answers():
        for n in args.ranks:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "out")
                mp.spawn(worker, args=(n, f"file://{tmp}/store", args.steps, out), nprocs=n)
                got = json.loads(Path(out).read_text())
            ours = [g["held"]["ours"] for g in got]
            zero = [g["held"]["zero"] for g in got]
            slowest = {k: max(g[k] for g in got) for k in ("ours", "zero", "full")}
            print(f"  {n:>5} {min(ours):>10,}-{max(ours):<10,} {min(zero):>9,}-{max(zero):<10,} "
                  f"{got[0]['held']['full']:>10,} {slowest['ours'] * 1e3:>10.1f} {slowest['zero'] * 1e3:>10.1f} "
                  f"{slowest['full'] * 1e3:>10.1f} {slowest['ours'] / slowest['zero']:>12.2f} "
                  f"{max(g['diff'] for g in got):>13.2e}")


if __name__ == "__main__":
    main()
