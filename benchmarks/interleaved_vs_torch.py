"""Benchmark: the lab's reference interleaved step (q15) beside torch.distributed.pipelining's
ScheduleInterleaved1F1B.

Same model chunks (each rank's `InterleavedStage` modules, shared with torch's stages), same configuration,
same batch, same processes, in one torchrun launch. Each iteration times three steps in rotating order
after warm-up: ours as the checks run it (every operation traced and journalled), ours untraced, and
ScheduleInterleaved1F1B's. A step's time is the slowest rank's, between two barriers; its CPU is the sum of
the ranks' process CPU time during the step (their communication threads included): where ranks share
cores, as 4 ranks on a laptop's 2 do, CPU decides the step time. Prints the median step times and CPU and
the ratios ours / ScheduleInterleaved1F1B (the target is at most 1.0). Both schedules' gradients
are compared once, as a sanity check.

    python benchmarks/interleaved_vs_torch.py [--steps 20] [--stages 4] [--chunks 2] [--microbatches 8]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(spec_path: str) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage as TorchStage
    from torch.distributed.pipelining import ScheduleInterleaved1F1B

    from lab_src.answers import use_answers
    from lab_src.exercises import check_args, interleaved_step
    from lab_src.harness import groups as distributed
    from lab_src.harness import runfolder
    from lab_src.pipeline import trace
    from lab_src.pipeline.chunked import InterleavedStage
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader

    spec = json.loads(Path(spec_path).read_text())
    ctx = distributed.init(120)
    cfg = LabConfig.from_dict(spec["config"])
    rank, p, m, v = ctx.rank, cfg.num_stages, cfg.num_microbatches, spec["chunks"]

    class Chunk(nn.Module):
        """One chunk's modules, for ScheduleInterleaved1F1B (no checks, no tracing)."""

        def __init__(self, stage, c):
            super().__init__()
            s = stage.virtual_stage(c)
            self.embed = stage.embed if s == 0 else None
            self.blocks = nn.ModuleList(stage.blocks[str(i)] for i in stage.chunk_layers[c])
            self.head = stage.head if s == stage.num_virtual_stages - 1 else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return self.head(x) if self.head is not None else x

    with use_answers(spec["answers"]):
        mbs = check_args(cfg.num_layers, p, cfg.global_batch_size, m)
        stage = InterleavedStage(cfg, rank, p, v, mbs, ctx.device, dist.group.WORLD)
        batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
        torch_stages = [TorchStage(Chunk(stage, c), stage.virtual_stage(c), v * p, ctx.device) for c in range(v)]
        theirs = ScheduleInterleaved1F1B(torch_stages, n_microbatches=m, loss_fn=lambda out, target: out.mean())
        target = torch.zeros(cfg.global_batch_size)
        journal = open(Path(spec["out"]).parent / f"journal.rank{rank}.log", "a", buffering=1)
        tracer = trace.Tracer(rank, lambda tag, pending: journal.write(runfolder.op_line(tag, pending)), None, "bench")
        micro_batches = list(batch.chunk(m))   # both schedules get the same batch, already loaded

        def ours_step(traced=True):
            data = iter(micro_batches) if rank == 0 else None
            if traced:
                with trace.tracing(tracer):
                    interleaved_step(stage, data, m)
                tracer.events.clear()
            else:
                interleaved_step(stage, data, m)
            stage.flush()

        def theirs_step():
            if rank == 0:
                theirs.step(batch)
            elif rank == p - 1:
                theirs.step(target=target, losses=[])
            else:
                theirs.step()

        cpu = {}

        def timed(step, name=None) -> float:
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            step()
            c1 = time.process_time()
            dist.barrier()
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            used = torch.tensor([c1 - c0])             # this rank's CPU, its threads (gloo's) included
            dist.all_reduce(used)
            if name:
                cpu.setdefault(name, []).append(float(used))
            return float(took)

        # sanity: one step of each from zero gradients gives the same gradients
        timed(ours_step)
        ours_grads = {n: q.grad.clone() for n, q in stage.named_parameters()}
        timed(theirs_step)
        worst = max(float((q.grad - ours_grads[n]).abs().max()) for n, q in stage.named_parameters())
        for _ in range(spec["warmup"]):
            timed(ours_step)
            timed(theirs_step)
        times = {"ours": [], "ours_untraced": [], "theirs": []}
        steps = [("ours", ours_step), ("ours_untraced", lambda: ours_step(traced=False)), ("theirs", theirs_step)]
        for i in range(spec["steps"]):
            for name, step in steps[i % 3:] + steps[:i % 3]:
                times[name].append(timed(step, name))
    diff = torch.tensor([worst])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps({**times, "max_grad_diff": float(diff), "cpu": cpu}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.reference import reference_sources
    from lab_src.harness.launcher import launch
    from lab_src.harness.runner import worker_env
    from lab_src.pipeline.config import DEMO

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--stages", type=int, default=DEMO.num_stages)
    ap.add_argument("--chunks", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=DEMO.num_microbatches)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench-interleaved")
    args = ap.parse_args()
    # every virtual stage gets a whole block: at least chunks * stages blocks
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches,
                       num_layers=max(DEMO.num_layers, args.chunks * args.stages))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = {"config": cfg.to_dict(), "chunks": args.chunks, "answers": reference_sources(), "steps": args.steps,
            "warmup": args.warmup, "out": str(out / "times.json")}
    (out / "spec.json").write_text(json.dumps(spec))
    env = worker_env()  # PYTHONPATH holds the repository, so torchrun finds benchmarks/ and lab_src/
    print(f"{cfg.describe()}, {args.chunks} chunks per rank; {args.steps} timed steps of each, alternating, after "
          f"{args.warmup} warm-up steps", flush=True)
    result = launch(cfg.num_stages, "benchmarks.interleaved_vs_torch", ["--worker", str(out / "spec.json")],
                    run_dir=out, deadline_s=1800, env=env)
    if not result.ok:
        print(result.launcher_log[-3000:], *result.rank_logs.values(), sep="\n")
        return 1
    times = json.loads((out / "times.json").read_text())
    cpu = times.pop("cpu")
    med = {k: statistics.median(v) for k, v in times.items() if k != "max_grad_diff"}
    print(f"gradients of the two schedules agree to {times['max_grad_diff']:.1e}")
    for name, label in (("ours", "lab reference interleaved, traced as in checks"),
                        ("ours_untraced", "lab reference interleaved, not traced"),
                        ("theirs", "ScheduleInterleaved1F1B")):
        t = times[name]
        print(f"  {label:<48} median {med[name] * 1e3:7.1f} ms   (min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})"
              f"   CPU {statistics.median(cpu[name]) * 1e3:.0f} ms")
    print(f"ratio ours / ScheduleInterleaved1F1B = {med['ours'] / med['theirs']:.3f} traced, "
          f"{med['ours_untraced'] / med['theirs']:.3f} untraced  (target: at most 1.0)")
    fast = {k: min(v) for k, v in times.items() if k != "max_grad_diff"}
    print(f"ratio of the fastest steps (less sensitive to other load on the machine) = "
          f"{fast['ours'] / fast['theirs']:.3f} traced, {fast['ours_untraced'] / fast['theirs']:.3f} untraced")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        os._exit(0)
    sys.exit(main())
