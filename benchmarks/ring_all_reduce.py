"""q19's ring against gloo's all-reduce: the reference ring on the student path (the lab's case launch, every
message recorded and journalled as in a check) beside `dist.all_reduce` of gloo, in the same launch, at lengths
from 1 element to 4,194,304 (16 MiB of float32), on 2 and 4 ranks; per length the median of the slowest rank's
time, algbw and busbw (nccl-tests' definitions), the ratio ring / gloo, and the alpha-beta fit of the ring.

    .venv/bin/python benchmarks/ring_all_reduce.py [--ranks 2 4] [--repeats 5]

It prints figures and asserts nothing (benchmarks/README.md has the figures measured on this machine).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@contextlib.contextmanager
def with_reference_answers():
    """Within the block, every exercise resolves to its reference answer (LAB_ANSWERS), and the current folder is a
    temporary one (where a study's runs go), removed afterwards."""
    from grader.reference import reference_sources
    before = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        answers = Path(tmp) / "answers.json"
        answers.write_text(json.dumps({k: str(v) for k, v in reference_sources().items()}))
        os.environ["LAB_ANSWERS"] = str(answers)
        os.chdir(tmp)
        try:
            yield
        finally:
            os.chdir(before)
            del os.environ["LAB_ANSWERS"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from lab_src.checks.ring_study import ring_study
    with with_reference_answers():
        for n in args.ranks:
            study = ring_study(n=n, repeats=args.repeats)      # prints its table (without the fit: q19 asks for it)
            alpha, beta = study.fit()
            print(f"the ring's alpha-beta fit: alpha = {alpha * 1e6:.0f} us, 1/beta = {1 / beta / 1e9:.2f} GB/s")
            big = max(study.ring)
            print(f"n = {n}, {big * 4:,} bytes: ring busbw {study.busbw(big, study.ring[big]) / 1e9:.3f} GB/s, "
                  f"gloo {study.busbw(big, study.gloo[big]) / 1e9:.3f} GB/s, ring / gloo time "
                  f"{study.ring[big] / study.gloo[big]:.2f}\n")


if __name__ == "__main__":
    main()
