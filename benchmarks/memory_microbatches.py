"""Benchmark: activation memory of the reference AFAB and 1F1B steps against the number of micro-batches,
up to 1F1B (and AFAB) with 1000 micro-batches on 4 stages of the small check model.

Each run is its own torchrun launch of 4 processes, so that the peak resident set size a rank reports
is that run's. Prints, per run and rank: the peak bytes of activations held for backward (counted by
torch.autograd.graph.saved_tensors_hooks, harness/memory.py), the most micro-batches held at once,
the peak RSS of the process, and the step's time.

    python benchmarks/memory_microbatches.py [--ms 8 32 64 1000] [--afab-max 1000]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from grader.reference import reference_sources
    from lab_src.checks.experiments import STEPS, small
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.judge.failures import rank_problems
    from lab_src.judge.problems import stamped
    from lab_src.judge.summary import summary
    from lab_src.pipeline.schedules import in_flight, schedule

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[8, 32, 64, 1000])
    ap.add_argument("--afab-max", type=int, default=1000, help="the largest m AFAB runs with")
    args = ap.parse_args()
    refs = reference_sources()
    print(f"small model: {small(8).describe().replace('batch 16 in 8 micro-batches, ', '')}; micro-batches of 2 "
          f"samples; one torchrun launch per run", flush=True)
    print(f"{'schedule':<6}{'m':>6}{'step':>9}  per rank: peak activation memory MiB (micro-batches held) / peak RSS MiB")
    peaks: dict[tuple[str, int], dict[int, int]] = {}
    with tempfile.TemporaryDirectory(prefix="pp-memory-") as tmp:
        for m in args.ms:
            for sched in ("afab", "1f1b"):
                if sched == "afab" and m > args.afab_max:
                    continue
                case = Case(kind="pipeline", qid=STEPS[sched], config=small(m), answers=refs, schedule=sched,
                            step=STEPS[sched], label=f"{sched} m={m}")
                started = time.monotonic()
                run = run_cases([case], Path(tmp) / f"{sched}-{m}", case_deadline_s=1200, timeout_s=300)
                out = run.outcomes[0]
                if out.failure or out.errors():
                    print(f"{sched} m={m} failed: {out.failure or summary(stamped(rank_problems(out.errors()), sched))}")
                    return 1
                events = out.events()
                step = max(e.t_end for e in events)
                mem = {r: out.obs[r]["memory"] for r in sorted(out.obs)}
                peaks[(sched, m)] = {r: v["peak_saved_bytes"] for r, v in mem.items()}
                ranks = "  ".join(f"r{r} {v['peak_saved_bytes'] / 2**20:7.3f} ({max(in_flight(events, r)):>4}) / "
                                  f"{v['peak_rss_bytes'] / 2**20:4.0f}" for r, v in mem.items())
                print(f"{sched:<6}{m:>6}{step:>8.2f}s  {ranks}   [launch {time.monotonic() - started:.0f} s]", flush=True)
    base = min(args.ms)
    for m in args.ms:
        if m == base or ("1f1b", base) not in peaks:
            continue
        worst = max(abs(peaks[("1f1b", m)][r] / peaks[("1f1b", base)][r] - 1) for r in peaks[("1f1b", base)])
        line = f"1F1B m={m} vs m={base}: largest change of a rank's peak {worst:.1%}"
        if ("afab", m) in peaks and ("afab", base) in peaks:
            line += f"; AFAB rank 0 grew {peaks[('afab', m)][0] / peaks[('afab', base)][0]:.1f}x (m grew {m / base:g}x)"
        print(line + f"  ({schedule('1f1b').title} holds min(p - r, m) micro-batches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
