"""q22's FSDP layer against FSDP2's `fully_shard` on the same model: every block of the lab's model wrapped by the
reference `fsdp_layer` (all-gather before the forward and again before the backward, the backward recomputing the
block's forward, a reduce-scatter of its gradient; the lab's gloo collectives, topics/sharding/fsdp.py; the
embedding and head replicated and averaged), beside the same model with `fully_shard` on every block and on the
root; on 2 and 4 data-parallel ranks (gloo, one thread each), SGD. Both start from the same weights and read the
same shards; per configuration it prints the parameters' largest difference after the steps (a sanity check), the
parameter bytes each rank holds at rest, the most gathered bytes ours held at once, the median step time (the
slowest rank's, between two barriers) and the ratio ours / fully_shard (target at most 1.0).

    .venv/bin/python benchmarks/fsdp_vs_torch.py [--ranks 2 4] [--steps 20]

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

CFG = dict(num_layers=8, hidden_size=128, num_heads=4, seq_len=32, vocab_size=256, num_microbatches=1, num_stages=1)
LR = 0.1


def worker(rank: int, n: int, init: str, steps: int, out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from lab_src import exercises
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    from lab_src.topics.sharding.fsdp import FsdpGroup
    from lab_src.topics.sharding.kind import held_bytes
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    cfg = LabConfig(**CFG, dp_size=n, global_batch_size=8 * n)
    x = next(iter(make_dataloader(cfg, 8, dp_rank=rank)))
    ours, theirs = build_model(cfg, "cpu"), build_model(cfg, "cpu")
    shapes = [[(name, p.shape, p.numel()) for name, p in block.named_parameters()] for block in ours.blocks]
    dp = FsdpGroup(dist.group.WORLD, list(range(n)), rank)
    for i in range(len(ours.blocks)):
        total = sum(p.numel() for p in ours.blocks[i].parameters())
        ours.blocks[i] = exercises.fsdp_layer(ours.blocks[i], dp)
        dp.register(f"blocks.{i}", ours.blocks[i].shard, total)      # as the kind does: no exchange of sizes
    replicated = [p for name, p in ours.named_parameters() if not name.startswith("blocks.")]
    mesh = init_device_mesh("cpu", (n,))
    for block in theirs.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(theirs, mesh=mesh)
    sgd = torch.optim.SGD(theirs.parameters(), lr=LR)

    def step_ours():
        ours(x).mean().backward()
        for p in replicated:
            dist.all_reduce(p.grad)
            p.grad /= n
        with torch.no_grad():
            for p in ours.parameters():
                if p.grad is not None:
                    p -= LR * p.grad

    def step_theirs():
        theirs(x).mean().backward()
        sgd.step()

    times, peaks = {"ours": [], "theirs": []}, []
    for k in range(steps + 2):
        for name, fn, model in (("ours", step_ours, ours), ("theirs", step_theirs, theirs)):
            for p in model.parameters():
                p.grad = None
            dp.new_step()
            dist.barrier()
            t0 = time.perf_counter()
            fn()
            dist.barrier()
            if k >= 2:
                times[name].append(time.perf_counter() - t0)
            if name == "ours":
                peaks.append(dp.peak)
    diff = 0.0
    for block, theirs_block, names in zip(ours.blocks, theirs.blocks, shapes):
        full = dp.gather_raw(block.shard.detach())
        offset = 0
        for (pname, shape, count), p in zip(names, theirs_block.parameters()):
            diff = max(diff, float((full[offset:offset + count].view(shape) - p.full_tensor().detach()).abs().max()))
            offset += count
    for (name, p), q in zip([(nm, p) for nm, p in ours.named_parameters() if not nm.startswith("blocks.")],
                            [q for nm, q in theirs.named_parameters() if not nm.startswith("blocks.")]):
        diff = max(diff, float((p.detach() - q.full_tensor().detach()).abs().max()))
    seen: set = set()
    rest = sum(held_bytes(p, seen)[0] for p in replicated) + sum(held_bytes(b, seen, skip=(dp,))[0] for b in ours.blocks)
    theirs_rest = sum(p.to_local().numel() * p.element_size() for p in theirs.parameters())
    result = {"diff": diff, "rest": rest, "theirs_rest": theirs_rest, "peak": max(peaks),
              "ours": statistics.median(times["ours"]), "theirs": statistics.median(times["theirs"])}
    gathered = [None] * n
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()                  # nothing of either model in flight when the groups go
    ours = theirs = sgd = mesh = None   # released before the groups go
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
    model = build_model(LabConfig(**CFG), "cpu")
    params = sum(p.numel() for p in model.parameters())
    block = sum(p.numel() for p in model.blocks[0].parameters())
    print(f"q22's fsdp_layer (reference) against FSDP2's fully_shard: the lab's model, {CFG['num_layers']} blocks of "
          f"{block * 4:,} B, {params * 4:,} B of float32 parameters in all; SGD; gloo, one thread per rank, "
          f"{os.cpu_count()} cores; median of {args.steps} steps")
    print(f"  {'ranks':>5} {'at rest: ours (B)':>18} {'fully_shard (B)':>16} {'ours peak gathered (B)':>23} "
          f"{'ours (ms)':>10} {'fully_shard (ms)':>17} {'ours / fully_shard':>19} {'largest diff':>13}")
    with with_reference_answers():
        for n in args.ranks:
            with tempfile.TemporaryDirectory() as tmp:
                out = os.path.join(tmp, "out")
                mp.spawn(worker, args=(n, f"file://{tmp}/store", args.steps, out), nprocs=n)
                got = json.loads(Path(out).read_text())
            slow = {k: max(g[k] for g in got) for k in ("ours", "theirs")}
            print(f"  {n:>5} {max(g['rest'] for g in got):>18,} {max(g['theirs_rest'] for g in got):>16,} "
                  f"{max(g['peak'] for g in got):>23,} {slow['ours'] * 1e3:>10.1f} {slow['theirs'] * 1e3:>17.1f} "
                  f"{slow['ours'] / slow['theirs']:>19.2f} {max(g['diff'] for g in got):>13.2e}")


if __name__ == "__main__":
    main()
