"""q19's network study with the reference ring: 4 ranks all-reduce the seed's four layers step after step over the
emulated network of the notebook (1 ms, 125 MB/s, 0.2 % of messages 100 times slower), and over the same network
without its tail; the share of steps that met a slow message against 1 - (1 - q)^k, and a step's p50 and p99
measured against the model's (the network's part, plus this machine's part read from the run without a tail,
plus the slow messages' extra delay).

    .venv/bin/python benchmarks/network_tail.py [--steps 400]

It prints figures and asserts nothing (benchmarks/README.md has the figures measured on this machine).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.ring_all_reduce import with_reference_answers  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    from lab_src.checks.network_study import NETWORK, network_study
    from lab_src.topics.data_parallel.tail import quantile
    with with_reference_answers():
        calm = network_study(steps=args.steps, network=dataclasses.replace(NETWORK, tail_share=0.0))
        print()
        tail = network_study(steps=args.steps)
    machine = quantile(calm.step_times, 0.5) - calm.base_step()
    p50, p99 = tail.modelled(machine)
    print(f"\nthis machine's part of a step (the run without a tail: p50 less the network's "
          f"{calm.base_step() * 1e3:.1f} ms): {machine * 1e3:.1f} ms; without a tail, p99 / p50 = "
          f"{quantile(calm.step_times, 0.99) / quantile(calm.step_times, 0.5):.2f}")
    print(f"steps that met a slow message: {len(tail.slow_steps())} of {len(tail.step_times)} "
          f"({len(tail.slow_steps()) / len(tail.step_times):.1%}); 1 - (1 - q)^k = {tail.predicted_share():.1%}")
    for name, q, model in (("p50", 0.5, p50), ("p99", 0.99, p99)):
        got = quantile(tail.step_times, q)
        print(f"step {name}: measured {got * 1e3:.1f} ms, model {model * 1e3:.1f} ms, ratio {got / model:.2f}")


if __name__ == "__main__":
    main()
