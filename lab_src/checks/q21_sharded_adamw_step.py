"""Visible check of q21 (sharded_adamw_step): the answer's sharded AdamW step on 4 data-parallel ranks (a model of
29,949 parameters, which do not divide by 4), then on a 2 x 2 grid (each stage's two replicas a group) with AdamW
settings other than torch's defaults, three steps each after the replica's 1F1B step, judged by topics/sharding/judge.py: the parameters against one process's
AdamW, the state and gradients each rank holds, the messages. It prints per rank the bytes held and sent beside a
shard's and the ring's, and the prediction beside the default model's figures.

    report = check("q21")
    report.timeline()          # the 4-rank run: the 1F1B steps, then the reduce-scatter and all-gather
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, GridViewReport, case_view, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.sharding.records import (
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_PARAMS,
    PREDICTION_RANKS,
    shard_bounds,
    zero_wanted,
)

CASES = [("n = 4, 29,949 parameters (uneven shards)", 4,
          LabConfig(num_stages=1, num_layers=2, vocab_size=61, num_microbatches=2, global_batch_size=16, dp_size=4,
                    seed=41)),
         ("2 x 2 grid: two replicas of a 2-stage pipeline; betas (0.8, 0.95), eps 1e-06, weight_decay 0.1", 4,
          LabConfig(num_stages=2, num_layers=4, vocab_size=67, seq_len=15, num_microbatches=4, global_batch_size=16,
                    dp_size=2, seed=42))]
# AdamW's settings beside lr, by case (torch's defaults where none are given): the grid passes others, as the grader
# does in one case, so that a step that wrote torch's defaults in is named here first
ADAMW = {1: {"betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.1}}


def check():
    from lab_src.judge.failures import case_problems
    from lab_src.topics.sharding.judge import judge_run
    srcs = sources("q21")
    cases = [make_case("zero", cfg, srcs, "q21", stages=n, label=label, settings={"steps": 3, **ADAMW.get(i, {})},
                       schedule="1f1b", step="q12") for i, (label, n, cfg) in enumerate(CASES)]
    run = run_cases(cases, run_dir("q21"))
    problems, lines = [], ["q21 sharded_adamw_step: three steps, each after the replica's 1F1B step"]
    for out in run.outcomes:
        lines.append(f"\n  {out.case.label}")
        errs = stamped(case_problems(out), "q21", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        found = judge_run(out)
        problems += [p for part in found.values() for p in stamped(part, "q21", out.case.label)]
        lines.append(table(out, found))
    lines.append(prediction_line(srcs.get("q21")))
    views = [{**case_view(o), "title": f"q21: {o.case.label}", "dp": o.case.config.dp_size,
              "pp": o.case.config.num_stages} for o in run.outcomes]
    return finish("q21", run, problems, lines, views=views, cls=GridViewReport)


def table(out, found) -> str:
    rows = [f"    {'rank':>4} {'stage':>5} {'elements':>9} {'state held (B)':>15} {'one shard (B)':>14} "
            f"{'whole (B)':>10} {'grads left':>10} {'sent/step (B)':>14} {'2(n-1)/n (B)':>13} {'parameters':>11}"]
    wrong = {p.rank for p in found["values"]}
    for r, o in sorted(out.obs.items()):
        ring = o.get("dp_group") or [r]
        n, total, elem = len(ring), o.get("elements", 0), o.get("element_size", 4)
        start, end = shard_bounds(total, n, ring.index(r))
        last = (o.get("steps") or [{}])[-1]
        sent = sum(b for _, b in last.get("sends") or [])
        rows.append(f"    {r:>4} {r % out.case.config.num_stages:>5} {total:>9,} {last.get('state_bytes', 0):>15,} "
                    f"{2 * (end - start) * elem:>14,} {2 * total * elem:>10,} {last.get('grad_bytes', 0):>10,} "
                    f"{sent:>14,} {2 * (n - 1) * total * elem / n:>13,.0f} "
                    f"{'differ' if r in wrong else 'as AdamW':>11}")
    return "\n".join(rows)


def prediction_line(path: str | None) -> str:
    """The graded prediction, each figure right or wrong as the grader judges it, a wrong one beside the default
    model's figure (the runs above use smaller models: the same fractions of their own parameters' bytes)."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    bytes per rank for the default model's {PREDICTION_PARAMS:,} float32 parameters on n = {PREDICTION_RANKS}")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    return "\n".join([head] + verdict_lines(got, zero_wanted(), "it is"))


__all__ = ["check"]
