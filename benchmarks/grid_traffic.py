"""Benchmark: q14's traffic, predicted and measured, on 4 processes (the reference answers).

For each configuration, runs the reference `dp_pp_step` N times in one torchrun launch and prints:
bytes per kind as recorded, beside the hidden tests' formula (they must be equal); the traffic model's
time per kind (busiest rank) on this machine (latency and bandwidth from the ping-pong each run times)
and on a described cluster, beside the measured time (medians over the runs); and the measured step.

    python benchmarks/grid_traffic.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LAB_CACHE", str(ROOT / "out" / "cache"))


def main() -> int:
    from grader.hidden.common import Context
    from grader.hidden.q14_dp_pp_step import expected_bytes
    from grader.reference import reference_sources
    from lab_src.checks.q14_dp_pp_step import CLUSTER, grid_view
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.topics.dp_pp import network
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG, TRAFFIC_KINDS, bytes_by_kind

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    reference = reference_sources()
    q05 = Context(student={}, reference=reference).reference_fn("q05")
    configs = {"2 x 2, tiny (the prediction's)": PREDICTION_CONFIG,
               "2 x 2, larger": LabConfig(num_layers=4, hidden_size=256, num_heads=8, seq_len=128, vocab_size=512,
                                          global_batch_size=16, num_microbatches=4, num_stages=2, dp_size=2,
                                          tie_embeddings=True),
               "1 x 4, tiny": PREDICTION_CONFIG.replace(num_stages=4, num_layers=8, dp_size=1, global_batch_size=12),
               "4 x 1, tiny": PREDICTION_CONFIG.replace(num_stages=1, dp_size=4, global_batch_size=48)}
    there = network.cluster(**CLUSTER)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; {args.runs} runs per configuration")
    print(f"cluster: {there.describe()}\n")
    with tempfile.TemporaryDirectory(prefix="grid-traffic-") as tmp:
        cases = [Case(kind="grid", qid="q14", config=cfg, answers=reference, stages=4, step="q14", label=name,
                      probes=["network"]) for name, cfg in configs.items() for _ in range(args.runs)]
        started = time.monotonic()
        run = run_cases(cases, Path(tmp), case_deadline_s=120, timeout_s=60)
        print(f"one launch of {len(cases)} cases: {time.monotonic() - started:.1f} s\n")
        for name, cfg in configs.items():
            outs = [o for o in run.outcomes if o.case.label == name and not o.failure and not o.errors()]
            if not outs:
                print(f"{name}: no run completed")
                continue
            views = [grid_view(o, name) for o in outs]
            measured_bytes = bytes_by_kind(views[0]["events"])
            want = expected_bytes(cfg, q05)
            here = [network.predict(network.operations(v["events"]), network.this_machine(v["link"])) for v in views]
            cluster = [network.predict(network.operations(v["events"]), there) for v in views]
            measured = [network.measure(v["events"]) for v in views]
            steps = [max(e.t_end for e in v["events"]) - min(e.t_start for e in v["events"]) for v in views]
            links = [network.this_machine(v["link"]).intra for v in views]
            print(f"{name}: {cfg.describe()}")
            print(f"  this machine's link (median of {len(views)}): "
                  f"{statistics.median(k.latency_s for k in links) * 1e6:.0f} µs + bytes / "
                  f"{statistics.median(k.bandwidth_Bps for k in links) / 1e9:.2f} GB/s; "
                  f"step (median) {statistics.median(steps) * 1e3:.1f} ms")
            print(f"  {'kind':<14}{'bytes measured':>15}{'formula':>12}{'model here':>13}{'model cluster':>15}"
                  f"{'measured':>11}")
            for k in TRAFFIC_KINDS:
                print(f"  {k:<14}{measured_bytes[k]:>15,}{want[k]:>12,}"
                      f"{statistics.median(t[k] for t in here) * 1e3:>10.3f} ms"
                      f"{statistics.median(t[k] for t in cluster) * 1e3:>12.4f} ms"
                      f"{statistics.median(t[k] for t in measured) * 1e3:>8.2f} ms")
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
