"""How closely the pipeline's learning curve follows the single process's (q13's tolerance rests on this).

    .venv/bin/python benchmarks/q13_curve_agreement.py [--steps 30] [--seeds 0 1 2]

The reference training loop (q13) around the reference AFAB step (q08) trains the digit classifier in
4 torchrun ranks (float32, gloo), one case per seed in one launch; the whole model trains in this process
on the same seeds and batches. Prints, per seed, the largest relative loss difference over the steps,
the step where it occurs, the held-out accuracies, and the wall times. Asserts nothing.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import tempfile

    from grader.reference import reference_sources
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.topics.training.records import relative_differences
    from lab_src.topics.training.digits import DIGITS, Digits
    from lab_src.topics.training.single_process import train_single_process
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args(argv)
    answers = reference_sources()
    settings = {"steps": args.steps, "lr": args.lr, "test_microbatches": 8}
    cases = [Case(kind="train", qid="q13", config=DIGITS.replace(seed=s), answers=answers, label=f"seed {s}",
                  step="q08", schedule="afab", settings=dict(settings)) for s in args.seeds]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.monotonic()
        run = run_cases(cases, Path(tmp) / "run", case_deadline_s=600, timeout_s=60)
        pipeline_s = time.monotonic() - started
    print(f"{len(cases)} pipelines of 4 ranks, {args.steps} steps each, in one launch: {pipeline_s:.1f} s")
    worst = 0.0
    for seed, out in zip(args.seeds, run.outcomes):
        last = out.obs.get(3, {})
        returned = last.get("returned") or {}
        if out.failure or last.get("error") or "losses" not in returned:
            print(f"seed {seed}: the run failed: {out.failure or last.get('error')}")
            continue
        cfg = DIGITS.replace(seed=seed)
        started = time.monotonic()
        single = train_single_process(cfg, Digits(cfg, 8), args.steps, args.lr)
        single_s = time.monotonic() - started
        diffs = relative_differences(returned["losses"], single["losses"])
        k = max(range(len(diffs)), key=diffs.__getitem__)
        worst = max(worst, diffs[k])
        print(f"seed {seed}: largest relative difference {diffs[k]:.2e} at step {k}; median "
              f"{sorted(diffs)[len(diffs) // 2]:.1e}; held-out accuracy pipeline {returned['test_accuracy']:.3f}, "
              f"single {single['test_accuracy']:.3f}; single process {single_s:.1f} s")
    print(f"largest over all seeds: {worst:.2e} (q13's tolerance: 1e-05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
