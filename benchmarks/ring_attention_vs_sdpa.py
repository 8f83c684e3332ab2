"""q24's reference `ring_attention` (contiguous and zigzag, causal) and `ulysses_attention` against torch's own
single-process `scaled_dot_product_attention`, on N = 2, 3 and 4 ranks of the lab's launcher (gloo, CPU), in one run.

Per N and run: the largest difference of the output and of dq, dk, dv from one process's SDPA (autograd) in float64
and float32, the bytes each rank sent in the forward and the backward against the formulas (records.py), the busiest
rank's forward matmul work over the mean against the layout's, and the time of the slowest rank's forward and
backward against one process's SDPA forward and backward of the whole sequence (the ratio: how much the ring or
Ulysses costs on this machine, where the ranks share its cores and a message costs milliseconds).

    .venv/bin/python benchmarks/ring_attention_vs_sdpa.py [--seq 512] [--heads 12] [--dim 32]

It asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=32)
    args = ap.parse_args()

    from grader.reference import reference_sources
    from lab_src.harness.case import Case
    from lab_src.harness.runner import run_cases
    from lab_src.harness.settings import settings_of
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.long_sequences.attention import single, tensors
    from lab_src.topics.long_sequences.judge_attention import ELEMENT, gathered, run_label, traffic, wanted

    ref = {k: str(v) for k, v in reference_sources().items()}
    shape = {"seq": args.seq, "heads": args.heads, "dim": args.dim}
    # a first, small run opens gloo's connections between the ranks (seconds, at times): it is not shown
    runs = [{"fn": "ring", "layout": "contiguous", "causal": False, "seq": 24, "heads": 2, "dim": 4},
            {"fn": "ring", "layout": "contiguous", "causal": True, **shape},
            {"fn": "ring", "layout": "zigzag", "causal": True, **shape},
            {"fn": "ulysses", "causal": True, **shape}]
    cases = [Case(kind="attention", qid="q24", config=LabConfig(num_stages=n, seed=90 + n), stages=n,
                  label=f"N = {n}, {dtype}", answers=ref, schedule="", step="",
                  settings={"runs": [dict(r) for r in runs], "dtype": dtype})
             for n in (2, 3, 4) for dtype in ("float64", "float32")]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "map.json").write_text(json.dumps(ref))
        os.environ["LAB_ANSWERS"] = str(Path(tmp) / "map.json")
        run = run_cases(cases, Path(tmp) / "run")
    # one process's SDPA, forward and backward of the whole sequence, for the time ratio
    sdpa = {}
    for dtype in ("float64", "float32"):
        q, k, v, dout = tensors({**runs[1]}, 0, 0, 1, dtype)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            single(q, k, v, dout, True)
            times.append(time.perf_counter() - t0)
        sdpa[dtype] = statistics.median(times)
    print(f"q24 reference against one process's scaled_dot_product_attention: S = {args.seq}, {args.heads} heads of "
          f"{args.dim}, one sequence; one process's SDPA forward and backward: "
          + ", ".join(f"{d} {1e3 * t:.1f} ms" for d, t in sdpa.items()))
    print(f"{'case':<14} {'run':<44} {'max |diff| out, dq, dk, dv':>36} {'fwd B/rank':>11} {'formula':>9} "
          f"{'bwd B/rank':>11} {'formula':>9} {'max/mean':>8} {'layout':>6} {'ms fwd+bwd':>10} {'x SDPA':>7}")
    for out in run.outcomes:
        s = settings_of(out.case)
        if out.failure or out.errors():
            print(f"{out.case.label:<14} did not finish: {out.failure or out.errors()}")
            continue
        rows = {r["label"]: r for r in traffic(out)}
        for index, r in enumerate(s.runs):
            if index == 0:
                continue
            want = wanted(out, index)
            diffs = []
            for i, name in enumerate(("out", "dq", "dk", "dv")):
                got = gathered(out, index, name, want[i])
                diffs.append(float((got.double() - want[i].double()).abs().max()) if got is not None else float("nan"))
            row = rows[run_label(r)]
            spans = [(o["runs"][index]["forward"]["span"], o["runs"][index]["backward"]["span"])
                     for o in out.obs.values()]
            ms = 1e3 * max(f[1] - f[0] + b[1] - b[0] for f, b in spans)
            fwd, bwd = sorted(row["forward"].values()), sorted(row["backward"].values())
            bal = f"{row['balance']:.2f}" if r["fn"] == "ring" and row["balance"] else "-"
            want_bal = f"{row['want_balance']:.2f}" if row["want_balance"] else "-"
            print(f"{out.case.label:<14} {run_label(r):<44} {' '.join(f'{d:.1e}' for d in diffs):>36} "
                  f"{fwd[-1]:>11,.0f} {row['want_forward']:>9,.0f} {bwd[-1]:>11,.0f} {row['want_backward']:>9,.0f} "
                  f"{bal:>8} {want_bal:>6} {ms:>10.1f} {ms / (1e3 * sdpa[s.dtype]):>7.1f}")
    print(f"(bytes: {ELEMENT['float64']} B an element in float64, {ELEMENT['float32']} in float32)")


if __name__ == "__main__":
    main()
