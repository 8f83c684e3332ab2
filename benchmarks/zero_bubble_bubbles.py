"""Benchmark: the bubble of the reference 1F1B (q12) and ZB-H1 (q16) steps against m, measured on a model
where compute dominates, beside their theory, with the T's of the run's own boxes, and the peak activation
memory of both: q16's study (lab_src/checks/zero_bubble_study.py) run on the reference answers.

    python benchmarks/zero_bubble_bubbles.py [--stages 2] [--ms 4 8 16]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stages", type=int, default=None, help="ranks (default: 4, or 2 under 4 cores)")
    ap.add_argument("--ms", type=int, nargs="+", default=[4, 8, 16])
    args = ap.parse_args()
    from grader.reference import reference_sources
    refs = reference_sources()
    os.environ["LAB_ANSWERS_DIR"] = str(Path(next(iter(refs.values()))).parent)   # every reference answer file
    os.chdir(tempfile.mkdtemp(prefix="zb-bubbles-"))                               # runs/ goes there
    from lab_src.checks.zero_bubble_study import zero_bubble_study
    study = zero_bubble_study(tuple(args.ms), args.stages)
    return 0 if study and study.rows else 1


if __name__ == "__main__":
    sys.exit(main())
