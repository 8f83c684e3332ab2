"""Ours against torch's: the harness of the benchmarks that time a lab reference step beside a
torch.distributed.pipelining schedule (afab_vs_gpipe.py, one_f_one_b_vs_schedule1f1b.py,
interleaved_vs_torch.py).

One torchrun launch; every rank builds both on the same modules, configuration and batch (a benchmark's
`contenders(spec, ctx)`, called under the reference answers). One step of each from zero gradients is
compared, as a sanity check; after warm-up, each iteration times three steps in rotating order: ours as
the checks run it (traced), ours untraced, and torch's. A step's time is the slowest rank's, between two
barriers; its CPU is the sum of the ranks' process CPU time during the step (their communication threads
included): where ranks share cores, CPU decides the step time. The launching process prints the median
step times (min, max) and the ratios ours / torch's (the target is at most 1.0).

A benchmark module defines `contenders` and a `main` that parses `arguments(...)` and calls `race(...)`, and
ends in `sys.exit(versus.run(contenders, main))`: torchrun starts the same module with `--worker SPEC`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lab_src.topics.interleaved.torch_bridge import mean_loss, stage_modules  # noqa: F401 - shared with the notebooks' bridge

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("ours", "ours_untraced", "theirs")     # the three steps of every iteration, in rotating order


@dataclass
class Contenders:
    """One rank's side of the race: what both steps fill, and the two steps."""
    stage: object                       # the lab's stage: its gradients are zeroed before each step, compared once
    ours: Callable[[bool], None]        # ours(traced): the lab's reference step, traced as in the checks or not
    theirs: Callable[[], None]          # one step of torch's schedule


def torch_step(schedule, rank: int, p: int, batch, target) -> Callable[[], None]:
    """One step of a torch.distributed.pipelining schedule: rank 0 feeds the batch, the last rank the target."""
    def step():
        if rank == 0:
            schedule.step(batch)
        elif rank == p - 1:
            schedule.step(target=target, losses=[])
        else:
            schedule.step()
    return step


def journal_tracer(spec: dict, rank: int):
    """A tracer that journals every operation to the run folder, in the checks' format."""
    from lab_src.harness import runfolder
    from lab_src.pipeline import trace
    journal = open(Path(spec["out"]).parent / f"journal.rank{rank}.log", "a", buffering=1)
    return trace.Tracer(rank, lambda tag, pending: journal.write(runfolder.op_line(tag, pending)), None, "bench")


def one_stage_per_rank(spec: dict, ctx, schedule_cls):
    """The lab's PipelineStage of this rank (under the reference answers), the batch as micro-batches, and
    one step of torch's `schedule_cls` on the same modules and batch."""
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage as TorchStage

    from lab_src.exercises import check_args
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.stage import PipelineStage

    cfg = LabConfig.from_dict(spec["config"])
    rank, p, m = ctx.rank, cfg.num_stages, cfg.num_microbatches
    mbs = check_args(cfg.num_layers, p, cfg.global_batch_size, m)
    stage = PipelineStage(cfg, rank, p, mbs, ctx.device, dist.group.WORLD)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    schedule = schedule_cls(TorchStage(stage_modules(stage), rank, p, ctx.device), n_microbatches=m,
                            loss_fn=mean_loss)
    micro_batches = list(batch.chunk(m))   # both schedules get the same batch, already loaded
    return stage, micro_batches, torch_step(schedule, rank, p, batch, torch.zeros(cfg.global_batch_size))


def worker(spec_path: str, contenders: Callable[[dict, object], Contenders]) -> None:
    """One rank: build the contenders, race them, and (rank 0) write the times to spec["out"]."""
    import torch
    import torch.distributed as dist

    from lab_src.answers import use_answers
    from lab_src.harness import groups as distributed

    spec = json.loads(Path(spec_path).read_text())
    ctx = distributed.init(120)
    cpu: dict[str, list[float]] = {}

    def timed(step, name=None) -> float:
        c.stage.zero_grad(set_to_none=True)
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

    with use_answers(spec["answers"]):
        c = contenders(spec, ctx)
        # sanity: one step of each from zero gradients gives the same gradients
        timed(c.ours)
        ours_grads = {n: q.grad.clone() for n, q in c.stage.named_parameters()}
        timed(c.theirs)
        worst = max(float((q.grad - ours_grads[n]).abs().max()) for n, q in c.stage.named_parameters())
        for _ in range(spec["warmup"]):
            timed(c.ours)
            timed(c.theirs)
        times: dict[str, list[float]] = {name: [] for name in KINDS}
        steps = list(zip(KINDS, (c.ours, lambda: c.ours(False), c.theirs)))
        for i in range(spec["steps"]):
            for name, step in steps[i % 3:] + steps[:i % 3]:
                times[name].append(timed(step, name))
    diff = torch.tensor([worst])
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    if ctx.rank == 0:
        Path(spec["out"]).write_text(json.dumps({"times": times, "cpu": cpu, "max_grad_diff": float(diff)}))
    dist.barrier()
    dist.destroy_process_group()


def arguments(doc: str, *, steps: int, out: str) -> argparse.ArgumentParser:
    """The options every such benchmark takes; a benchmark may add its own before parsing."""
    from lab_src.pipeline.config import DEMO
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--stages", type=int, default=DEMO.num_stages)
    ap.add_argument("--microbatches", type=int, default=DEMO.num_microbatches)
    ap.add_argument("--out", type=Path, default=ROOT / "out" / out)
    return ap


def race(module: str, args, cfg, *, what: str, labels: dict[str, str], theirs: str, extra: dict | None = None,
         cpu: bool = False, fastest: bool = False) -> int:
    """Launch `module`'s workers on `cfg` and print the figures. `what` describes the run, `labels` names the
    three steps (KINDS), `theirs` torch's schedule; `extra` goes into the spec; `cpu` adds each step's CPU,
    `fastest` the ratios of the fastest steps."""
    from grader.reference import reference_sources
    from lab_src.harness.launcher import launch
    from lab_src.harness.runner import worker_env

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("journal.rank*.log"):
        old.unlink()
    spec = {"config": cfg.to_dict(), "answers": reference_sources(), "steps": args.steps, "warmup": args.warmup,
            "out": str(out / "times.json"), **(extra or {})}
    (out / "spec.json").write_text(json.dumps(spec))
    print(f"{what}; {args.steps} timed steps of each, alternating, after {args.warmup} warm-up steps", flush=True)
    # worker_env: PYTHONPATH holds the repository, so torchrun finds benchmarks/ and lab_src/
    result = launch(cfg.num_stages, module, ["--worker", str(out / "spec.json")], run_dir=out, deadline_s=1800,
                    env=worker_env())
    if not result.ok:
        print(result.launcher_log[-3000:], *result.rank_logs.values(), sep="\n")
        return 1
    record = json.loads((out / "times.json").read_text())
    times = record["times"]
    med = {k: statistics.median(v) for k, v in times.items()}
    width = max(46, 2 + max(len(label) for label in labels.values()))
    print(f"gradients of the two schedules agree to {record['max_grad_diff']:.1e}")
    for name in KINDS:
        t = times[name]
        line = (f"  {labels[name]:<{width}} median {med[name] * 1e3:7.1f} ms   "
                f"(min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
        print(line + (f"   CPU {statistics.median(record['cpu'][name]) * 1e3:.0f} ms" if cpu else ""))
    print(f"ratio ours / {theirs} = {med['ours'] / med['theirs']:.3f} traced, "
          f"{med['ours_untraced'] / med['theirs']:.3f} untraced  (target: at most 1.0)")
    if fastest:
        fast = {k: min(v) for k, v in times.items()}
        print(f"ratio of the fastest steps (less sensitive to other load on the machine) = "
              f"{fast['ours'] / fast['theirs']:.3f} traced, {fast['ours_untraced'] / fast['theirs']:.3f} untraced")
    return 0


def run(contenders: Callable[[dict, object], Contenders], main: Callable[[], int]) -> int:
    """A benchmark's entry point: a torchrun worker (`--worker SPEC`) races, otherwise `main()` launches."""
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2], contenders)
        os._exit(0)
    return main()
