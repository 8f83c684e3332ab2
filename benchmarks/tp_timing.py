"""What q17's and q18's benchmarks against torch's tensor parallel share (tp_vs_torch.py, tp_block_vs_torch.py):
in the ranks, the three ways of one step timed in turn; in the launching process, the launch and the table.

The three ways (`KINDS`): the lab's reference with its collectives recorded (as in a check), the same not
recorded, and torch's `parallelize_module`. Each timed step starts at a barrier and counts as long as the
slowest rank took; the order of the three rotates from step to step, so none always runs first.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

KINDS = ("ours", "ours_unrecorded", "theirs")


def time_in_turn(fns, warmup: int, steps: int) -> dict[str, list[float]]:
    """In every rank: {kind: seconds of each timed step} for the three step functions `fns` (KINDS' order)."""
    import time

    import torch
    import torch.distributed as dist

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        took = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return float(took)
    order = list(zip(KINDS, fns))
    for _ in range(warmup):
        for _, fn in order:
            timed(fn)
    times = {k: [] for k in KINDS}
    for i in range(steps):
        for name, fn in order[i % 3:] + order[:i % 3]:
            times[name].append(timed(fn))
    return times


def finish(spec: dict, times: dict, diffs: list) -> None:
    """In every rank: the largest difference over the ranks; rank 0 writes the record; the group ends."""
    import torch
    import torch.distributed as dist
    worst = torch.tensor([float(max(diffs))])
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    if dist.get_rank() == 0:
        Path(spec["out"]).write_text(json.dumps({"times": times, "max_diff": float(worst)}))
    dist.barrier()
    dist.destroy_process_group()


def launch_and_report(module: str, ranks: int, spec: dict, out: Path, labels: dict[str, str]) -> int:
    """Launch `module --worker spec` on `ranks` ranks; print each way's median and the ratios to torch."""
    from lab_src.harness.launcher import launch
    from lab_src.harness.runner import worker_env
    (out / "spec.json").write_text(json.dumps(spec))
    result = launch(ranks, module, ["--worker", str(out / "spec.json")], run_dir=out, deadline_s=1800,
                    env=worker_env())
    if not result.ok:
        print(result.launcher_log[-3000:], *result.rank_logs.values(), sep="\n")
        return 1
    record = json.loads((out / "times.json").read_text())
    times = record["times"]
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"outputs, input gradients and every shard's gradients agree to {record['max_diff']:.1e}")
    width = max(len(label) for label in labels.values()) + 2
    for name in KINDS:
        t = times[name]
        print(f"  {labels[name]:<{width}} median {med[name] * 1e3:7.2f} ms   (min {min(t) * 1e3:.2f}, "
              f"max {max(t) * 1e3:.2f})")
    print(f"ratio ours / torch's tensor parallel = {med['ours'] / med['theirs']:.3f} recorded, "
          f"{med['ours_unrecorded'] / med['theirs']:.3f} not recorded  (target: at most 1.0)")
    return 0
