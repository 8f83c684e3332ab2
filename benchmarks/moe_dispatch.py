"""q25's reference dispatch and combine on ep ranks (gloo, one thread a rank): per rank and MoE layer, the bytes its
all-to-alls send to other ranks against the closed form for routing spread evenly (2 T k (ep - 1)/ep rows of h
elements forward, as many backward: topics/experts/records.py), and the time of the MoE layer's parts (the counts
exchange, the dispatch, the experts, the combine, and the backward) against a dense MLP of the same active
parameters (h -> 2hk -> h: the k experts a token runs, as one MLP) on the same tokens, in one run.

    .venv/bin/python benchmarks/moe_dispatch.py [--ranks 2 4] [--tokens 1024] [--hidden 64] [--k 2] [--steps 10]

Routing comes from a random router (not exactly even), no capacity; float32. It asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def reference():
    from grader.reference import reference_sources
    path = reference_sources()["q25"]
    module = types.ModuleType("q25_reference")
    exec(compile(Path(path).read_text(), str(path), "exec"), module.__dict__)  # noqa: S102 - the reference answer
    return module


def worker(rank: int, n: int, init: str, args, out: str) -> None:
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    from lab_src.topics.experts.moe import Expert
    ref = reference()
    h, k, T, E = args.hidden, args.k, args.tokens, 2 * n
    L = E // n
    g = torch.Generator().manual_seed(0)
    router = torch.nn.Linear(h, E)
    with torch.no_grad():
        router.weight.copy_(torch.randn(E, h, generator=g) / h ** 0.5)
    torch.manual_seed(1 + rank)
    experts = [Expert(h) for _ in range(L)]
    dense = torch.nn.Sequential(torch.nn.Linear(h, 2 * h * k), torch.nn.GELU(), torch.nn.Linear(2 * h * k, h))
    x = torch.randn(T, h, generator=torch.Generator().manual_seed(100 + rank), requires_grad=True)
    sent = {"fwd": 0, "bwd": 0}
    original = dist.all_to_all_single
    phase = ["fwd"]

    def counting(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
        if input.is_floating_point():
            splits = input_split_sizes or [input.shape[0] // n] * n
            row = input[0].numel() * input.element_size() if input.shape[0] else 0
            sent[phase[0]] += sum(s for j, s in enumerate(splits) if j != rank) * row
        return original(output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op)
    ref.dist.all_to_all_single = counting
    times = {key: [] for key in ("route", "dispatch", "experts", "combine", "backward", "moe", "dense")}
    for step in range(args.steps + 1):
        sent.update(fwd=0, bwd=0)
        phase[0] = "fwd"
        dist.barrier()
        t0 = time.perf_counter()
        routing = ref.route(x, router, k, 0.0)
        t1 = time.perf_counter()
        tokens, per_expert, meta = ref.dispatch(x, routing, None)
        t2 = time.perf_counter()
        y = torch.cat([e(c) for e, c in zip(experts, torch.split(tokens, per_expert))])
        t3 = time.perf_counter()
        combined = ref.combine(y, meta, None)
        t4 = time.perf_counter()
        phase[0] = "bwd"
        combined.sum().backward()
        t5 = time.perf_counter()
        dist.barrier()
        t6 = time.perf_counter()
        dense(x).sum().backward()
        t7 = time.perf_counter()
        if step:            # the first is a warm-up
            for key, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0, t7 - t6)):
                times[key].append(v)
    result = {"sent": dict(sent), "times": {key: statistics.median(v) for key, v in times.items()}}
    gathered = [None] * n
    dist.all_gather_object(gathered, result)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from lab_src.topics.experts.records import even_bytes_per_layer
    print(f"q25's reference MoE layer on ep ranks, 2 experts a rank, T = {args.tokens} tokens a rank, k = {args.k}, "
          f"h = {args.hidden}, float32, no capacity; gloo, one thread a rank, {os.cpu_count()} cores; median of "
          f"{args.steps} steps; times in ms, the slowest rank's")
    print(f"  {'ep':>3} {'sent fwd (B)':>22} {'closed form (B)':>16} {'sent bwd (B)':>22} {'route':>6} {'dispatch':>9} "
          f"{'experts':>8} {'combine':>8} {'backward':>9} {'MoE':>7} {'dense MLP':>10} {'MoE/dense':>10}")
    for n in args.ranks:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            mp.spawn(worker, args=(n, f"file://{tmp}/store", args, out), nprocs=n)
            got = json.loads(Path(out).read_text())
        form = even_bytes_per_layer(args.tokens, args.k, args.hidden, n, 4)
        t = {key: max(g["times"][key] for g in got) * 1e3 for key in got[0]["times"]}
        fwd = [g["sent"]["fwd"] for g in got]
        bwd = [g["sent"]["bwd"] for g in got]
        print(f"  {n:>3} {min(fwd):>10,}-{max(fwd):<11,} {form:>16,} {min(bwd):>10,}-{max(bwd):<11,} "
              f"{t['route']:>6.1f} {t['dispatch']:>9.1f} {t['experts']:>8.1f} {t['combine']:>8.1f} "
              f"{t['backward']:>9.1f} {t['moe']:>7.1f} {t['dense']:>10.1f} {t['moe'] / t['dense']:>10.1f}")


if __name__ == "__main__":
    main()
