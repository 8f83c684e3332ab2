"""Benchmark: the lab's reference AFAB step beside torch.distributed.pipelining's ScheduleGPipe.

Same model (the lab's stages), same configuration, same batch, same processes, in one torchrun launch.
Each iteration times three steps in rotating order after warm-up: ours as the checks run it (every
operation traced and journalled, every wait one the check can stop: pipeline/waiting.py), ours
untraced with plain waits, and ScheduleGPipe's. A step's time is the slowest
rank's, between two barriers. Prints the median step times and the ratios ours / ScheduleGPipe (the
target is at most 1.0). Both schedules' gradients are compared once, as a sanity check.

    python benchmarks/afab_vs_gpipe.py [--steps 30] [--stages 4] [--microbatches 8]
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
    from torch.distributed.pipelining import ScheduleGPipe

    from lab_src.harness import groups as distributed
    from lab_src.harness import runfolder
    from lab_src.pipeline import trace, waiting
    from lab_src.answers import use_answers
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.exercises import afab_step, check_args
    from lab_src.pipeline.stage import PipelineStage

    spec = json.loads(Path(spec_path).read_text())
    ctx = distributed.init(120)
    cfg = LabConfig.from_dict(spec["config"])
    rank, p, m = ctx.rank, cfg.num_stages, cfg.num_microbatches

    class Piece(nn.Module):
        """The stage's own modules, for ScheduleGPipe (no checks, no tracing)."""

        def __init__(self, stage):
            super().__init__()
            self.embed, self.blocks, self.head = stage.embed, stage.blocks, stage.head

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks.values():
                x = block(x)
            return self.head(x) if self.head is not None else x

    with use_answers(spec["answers"]):
        mbs = check_args(cfg.num_layers, p, cfg.global_batch_size, m)
        stage = PipelineStage(cfg, rank, p, mbs, ctx.device, dist.group.WORLD)
        batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
        theirs = ScheduleGPipe(TorchStage(Piece(stage), rank, p, ctx.device), n_microbatches=m,
                               loss_fn=lambda out, target: out.mean())
        target = torch.zeros(cfg.global_batch_size)
        journal = open(Path(spec["out"]).parent / f"journal.rank{rank}.log", "a", buffering=1)
        tracer = trace.Tracer(rank, lambda tag, pending: journal.write(runfolder.op_line(tag, pending)), None, "bench")
        micro_batches = list(batch.chunk(m))   # both schedules get the same batch, already loaded

        def ours_step(traced=True):
            data = iter(micro_batches) if rank == 0 else None
            if traced:
                with trace.tracing(tracer), waiting.stop_when(lambda: None):
                    afab_step(stage, data, m)
                    stage.flush()
                tracer.events.clear()
            else:
                afab_step(stage, data, m)
            stage.flush()

        def theirs_step():
            if rank == 0:
                theirs.step(batch)
            elif rank == p - 1:
                theirs.step(target=target, losses=[])
            else:
                theirs.step()

        def timed(step) -> float:
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            step()
            dist.barrier()
            took = torch.tensor([time.perf_counter() - t0])
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
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
                times[name].append(timed(step))
    diff = torch.tensor([worst])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if rank == 0:
        Path(spec["out"]).write_text(json.dumps({**times, "max_grad_diff": float(diff)}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.reference import reference_sources
    from lab_src.pipeline.config import DEMO
    from lab_src.harness.launcher import launch
    from lab_src.harness.runner import worker_env

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--stages", type=int, default=DEMO.num_stages)
    ap.add_argument("--microbatches", type=int, default=DEMO.num_microbatches)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "bench")
    args = ap.parse_args()
    cfg = DEMO.replace(num_stages=args.stages, num_microbatches=args.microbatches)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = {"config": cfg.to_dict(), "answers": reference_sources(), "steps": args.steps, "warmup": args.warmup,
            "out": str(out / "times.json")}
    (out / "spec.json").write_text(json.dumps(spec))
    env = worker_env()  # PYTHONPATH holds the repository, so torchrun finds benchmarks/ and lab_src/
    print(f"{cfg.describe()}; {args.steps} timed steps of each, alternating, after {args.warmup} warm-up steps",
          flush=True)
    result = launch(cfg.num_stages, "benchmarks.afab_vs_gpipe", ["--worker", str(out / "spec.json")],
                    run_dir=out, deadline_s=1800, env=env)
    if not result.ok:
        print(result.launcher_log[-3000:], *result.rank_logs.values(), sep="\n")
        return 1
    times = json.loads((out / "times.json").read_text())
    med = {k: statistics.median(v) for k, v in times.items() if k != "max_grad_diff"}
    print(f"gradients of the two schedules agree to {times['max_grad_diff']:.1e}")
    for name, label in (("ours", "lab reference AFAB, traced as in the checks"),
                        ("ours_untraced", "lab reference AFAB, not traced"), ("theirs", "ScheduleGPipe")):
        t = times[name]
        print(f"  {label:<46} median {med[name] * 1e3:7.1f} ms   (min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
    print(f"ratio ours / ScheduleGPipe = {med['ours'] / med['theirs']:.3f} traced, "
          f"{med['ours_untraced'] / med['theirs']:.3f} untraced  (target: at most 1.0)")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
        os._exit(0)
    sys.exit(main())
