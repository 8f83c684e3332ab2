"""Visible check of q19 (ring_all_reduce): the answer's ring on 4 ranks, summing the gradients of the seed's four
layers (fc1..fc4 of its 784-256-128-64-10 MLP, float32) and a few short tensors, then on the two data-parallel
columns of a 2 x 2 grid (rings of 2 whose neighbours are not global rank +- 1), judged by
topics/data_parallel/judge.py: the sums, the same bits on every rank, and the messages (neighbours, sizes,
count). It prints, per length, the bytes each rank sent beside a ring's 2(n-1)/n and your prediction.

    report = check("q19")
    report.timeline()          # the 4-rank run: every message of every rank, on a measured time axis
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, CheckReport, finish, kind_view, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.data_parallel.records import PREDICTION_KEYS, PREDICTION_NAME, PREDICTION_RANKS, SEED_LAYERS, ring_bytes

SHORT = [1, 3, 5, 1000]
CASES = [("n = 4, the seed's four layers and short tensors", 4, {"lengths": list(SEED_LAYERS.values()) + SHORT}),
         ("n = 2 x 2: the data-parallel columns of a 2 x 2 grid", 4, {"lengths": [7, 4099], "columns": 2})]


def check() -> CheckReport:
    from lab_src.topics.data_parallel.judge import judge_run, ring_errors, traffic
    srcs = sources("q19")
    cfg = LabConfig(num_stages=4, seed=3)
    cases = [make_case("ring", cfg, srcs, "q19", stages=n, label=label, settings=settings)
             for label, n, settings in CASES]
    run = run_cases(cases, run_dir("q19"))
    problems, lines = [], ["q19 ring_all_reduce: each length summed over the ring, against the inputs' sum"]
    for (label, n, settings), out in zip(CASES, run.outcomes):
        lines.append(f"\n  {label}")
        errs = ring_errors(out, "q19", label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        found = judge_run(out)
        problems += stamped(found["sums"] + found["ring"], "q19", label)
        lines.append(traffic_table(traffic(out), settings.get("columns")))
    lines.append(prediction_line(srcs.get("q19")))
    views = [kind_view(o) for o in run.outcomes]     # topics/data_parallel/figure.py ring_view
    return finish("q19", run, problems, lines, views=views)


def traffic_table(rows: list[dict], columns: int | None) -> str:
    names = {v: k for k, v in SEED_LAYERS.items()}
    out = [f"    {'length':>10} {'':4} {'sent per rank (B)':>22} {'2(n-1)/n (B)':>13} {'messages':>9} "
           f"{'largest (B)':>12} {'time (ms)':>10}"]
    for row in rows:
        sent = sorted(row["sent"].values())
        span = f"{sent[0]:,}" if sent[0] == sent[-1] else f"{sent[0]:,} to {sent[-1]:,}"
        msgs = sorted(row["messages"].values())
        out.append(f"    {row['length']:>10,} {names.get(row['length'], '') if not columns else '':4} {span:>22} "
                   f"{row['ideal']:>13,.0f} {msgs[0] if msgs[0] == msgs[-1] else f'{msgs[0]}-{msgs[-1]}':>9} "
                   f"{row['largest']:>12,} {row['seconds'] * 1e3:>10.1f}")
    return "\n".join(out)


def prediction_line(path: str | None) -> str:
    """The graded prediction, each layer's number right or wrong as the grader judges it, a wrong one beside the
    bytes a ring sends (the column "2(n-1)/n" of the table above, for the seed's four layers)."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    the bytes each rank of a ring of {PREDICTION_RANKS} sends on average, per layer")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    want = {k: ring_bytes(v, PREDICTION_RANKS) for k, v in SEED_LAYERS.items()}
    return "\n".join([head] + verdict_lines(got, want, "measured"))


__all__ = ["check"]
