"""q20's reducer against torch's DistributedDataParallel on the same model: the reference Reducer (its buckets
launched from post-accumulate hooks, armed before the last micro-batch's backward, each reduced by the reference
q19 ring in the rank's reducing thread: topics/data_parallel/bucket_ring.py) beside `DistributedDataParallel`
with the same bucket cap and `no_sync()` for every micro-batch but the last, on 2 and 4 data-parallel ranks (gloo,
one thread each). Both start from the same weights and read the same shards; per configuration it prints the
gradients' largest difference (a sanity check), the median step time of each (the slowest rank's, between two
barriers) and the ratio reducer / DDP; and the same reducer with gloo's all-reduce in place of the ring, which
separates the reducer's own cost (hooks, flattening, one Python thread) from the ring's (2(n - 1) Python-level
messages per bucket).

    .venv/bin/python benchmarks/buckets_vs_ddp.py [--ranks 2 4] [--steps 20] [--cap-mib 0.25 1]

The rings are the lab's untraced (nothing recorded: no check runs them here), without the check's comparison of
the replicas' buckets before each ring (bucket_ring.py `agree`). It asserts nothing.
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

CFG = dict(num_layers=8, hidden_size=128, num_heads=4, seq_len=32, vocab_size=256, num_microbatches=4, num_stages=1)


def worker(rank: int, n: int, init: str, cap: int, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from lab_src import answers
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    from lab_src.topics.data_parallel.bucket_ring import DataParallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    cfg = LabConfig(**CFG, dp_size=n, global_batch_size=8 * n)
    m = cfg.num_microbatches
    mbs = cfg.global_batch_size // (n * m)
    batches = [b for b in make_dataloader(cfg, mbs, dp_rank=rank)]
    Reducer = answers.load("q20").__globals__["Reducer"]
    ours, glooed = build_model(cfg, "cpu"), build_model(cfg, "cpu")
    reducer = Reducer(ours, DataParallel(dist.group.WORLD, list(range(n)), rank, agree=False), cap)
    gloo = Reducer(glooed, DataParallel(dist.group.WORLD, list(range(n)), rank, agree=False,
                                        all_reduce=lambda t, g: dist.all_reduce(t, group=g)), cap)
    ddp = DistributedDataParallel(build_model(cfg, "cpu"), bucket_cap_mb=cap / 2 ** 20)

    def step_with(model, red):
        def step():
            for mb, x in enumerate(batches):
                if mb == m - 1:
                    red.arm()
                (model(x).mean() / m).backward()
            red.finish()
        return step

    def step_ddp():
        for mb, x in enumerate(batches):
            if mb < m - 1:
                with ddp.no_sync():
                    (ddp(x).mean() / m).backward()
            else:
                (ddp(x).mean() / m).backward()

    times = {"ours": [], "gloo": [], "ddp": []}
    for k in range(steps + 2):
        for name, fn, model in (("ours", step_with(ours, reducer), ours), ("gloo", step_with(glooed, gloo), glooed),
                                ("ddp", step_ddp, ddp.module)):
            for p in model.parameters():
                p.grad = None
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            if k >= 2:                      # two steps of warm-up
                times[name].append(time.perf_counter() - t0)
    diff = max(float((a.grad - b.grad).abs().max()) for a, b in zip(ours.parameters(), ddp.module.parameters()))
    if rank == 0:
        Path(out).write_text(json.dumps({"buckets": len(reducer.buckets), "diff": diff,
                                         **{k: statistics.median(v) for k, v in times.items()}}))
    reducer.dp.close()
    gloo.dp.close()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cap-mib", type=float, nargs="+", default=[0.25, 1.0])
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from benchmarks.ring_all_reduce import with_reference_answers
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.model import build_model
    params = sum(p.numel() for p in build_model(LabConfig(**CFG), "cpu").parameters())
    print(f"q20's reducer (reference) against DistributedDataParallel: the lab's model, {CFG['num_layers']} blocks, "
          f"hidden {CFG['hidden_size']}, {params * 4:,} B of float32 gradients; m = {CFG['num_microbatches']} "
          f"micro-batches of 8 samples per rank; gloo, one thread per rank, {os.cpu_count()} cores; median of "
          f"{args.steps} steps")
    print(f"  {'ranks':>5} {'cap':>9} {'buckets':>7} {'reducer (ms)':>13} {'with gloo (ms)':>15} {'DDP (ms)':>9} "
          f"{'reducer / DDP':>14} {'with gloo / DDP':>16} {'largest grad diff':>18}")
    with with_reference_answers():
        for n in args.ranks:
            for cap_mib in args.cap_mib:
                cap = int(cap_mib * 2 ** 20)
                with tempfile.TemporaryDirectory() as tmp:
                    out = os.path.join(tmp, "out")
                    mp.spawn(worker, args=(n, f"file://{tmp}/store", cap, args.steps, out), nprocs=n)
                    got = json.loads(Path(out).read_text())
                print(f"  {n:>5} {cap_mib:>6g} MiB {got['buckets']:>7} {got['ours'] * 1e3:>13.1f} "
                      f"{got['gloo'] * 1e3:>15.1f} {got['ddp'] * 1e3:>9.1f} {got['ours'] / got['ddp']:>14.2f} "
                      f"{got['gloo'] / got['ddp']:>16.2f} {got['diff']:>18.2e}")


if __name__ == "__main__":
    main()
