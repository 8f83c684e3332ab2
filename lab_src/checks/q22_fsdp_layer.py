"""Visible check of q22 (fsdp_layer): the answer's module wrapping every block of a 2 x 2 grid's stages (two
replicas of a 2-stage pipeline, 2 blocks a stage, each stage's replicas a group), three steps of m = 4 micro-batches,
judged by topics/sharding/judge_fsdp.py: the whole gradients against one process's, the bytes held at rest and at
the peak, the gathers and reduce-scatters. It prints them per rank, and the prediction beside the default model's
figures.

    report = check("q22")
    report.timeline()          # the run: each rank's 1F1B steps, the gathers inside the forward and backward boxes
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, GridViewReport, case_view, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.sharding.records import (
    BLOCK_PARAMS,
    FSDP_PREDICTION,
    FSDP_PREDICTION_BLOCKS,
    FSDP_PREDICTION_KEYS,
    FSDP_PREDICTION_M,
    FSDP_PREDICTION_RANKS,
    fsdp_wanted,
)

CFG = LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16, dp_size=2, seed=61)


def check():
    from lab_src.judge.failures import case_problems
    from lab_src.topics.sharding.judge_fsdp import judge_run, ring_may_be_at_fault
    srcs = sources("q22")
    case = make_case("fsdp", CFG, srcs, "q22", stages=4, label="2 x 2 grid, 2 blocks a stage, m = 4",
                     settings={"steps": 3}, schedule="1f1b", step="q12")
    run = run_cases([case], run_dir("q22"))
    out = run.outcomes[0]
    lines = [f"q22 fsdp_layer: {case.label}, three steps"]
    view = {**case_view(out), "title": f"q22: {case.label}", "dp": CFG.dp_size, "pp": CFG.num_stages}
    errs = stamped(case_problems(out), "q22", case.label)
    if errs:
        ring = [ON_YOUR_RING] if ring_may_have_stopped(out) else []
        return finish("q22", run, errs, lines + [UNFINISHED, *ring], views=[view], cls=GridViewReport)
    found = judge_run(out)
    problems = [p for part in found.values() for p in stamped(part, "q22", case.label)]
    lines.append(table(out, found))
    lines.append(prediction_line(srcs.get("q22")))
    if ring_may_be_at_fault(found["values"]):
        lines.append(ON_YOUR_RING)
    return finish("q22", run, problems, lines, views=[view], cls=GridViewReport)


ON_YOUR_RING = ("\n  dp.all_gather and dp.reduce_scatter run on your q19 ring_all_reduce: if q19's check does not pass, "
                "fix q19 first (../data_parallel/q19_ring_all_reduce.ipynb)")


def ring_may_have_stopped(out) -> bool:
    """Whether the q19 ring may be why the run did not finish: not where ranks raised and none of their errors
    passed through the q19 answer (its frames are named "<answer to q19>": harness/worker.py)."""
    from lab_src.judge.failures import is_wait
    raised = [e for e in out.errors().values() if not is_wait(e) and e.get("type") != "NotRun"]
    return not raised or any(str(f[0]) == "<answer to q19>" for e in raised for f in e.get("where") or [])


def table(out, found) -> str:
    wrong = {p.rank for p in found["values"]}
    elem = 8 if out.case.config.dtype == "float64" else 4
    rows = [f"    {'rank':>4} {'stage':>5} {'at rest (B)':>12} {'replicated (B)':>15} {'shards (B)':>11} "
            f"{'peak gathered (B)':>18} {'one layer (B)':>14} {'gathers/block':>14} {'scatters/block':>15} "
            f"{'gradients':>10}"]
    for r, o in sorted(out.obs.items()):
        layers = o.get("layers_flat") or {}
        last = (o.get("steps") or [{}])[-1]
        first_layer = sorted(layers)[0] if layers else None
        gathers = sum(1 for _, name, _ in last.get("gathers") or [] if name == first_layer)
        scatters = len(last.get("scatters") or []) // max(1, len(layers))
        rows.append(f"    {r:>4} {r % out.case.config.num_stages:>5} {o.get('rest_bytes', 0):>12,} "
                    f"{o.get('replicated_bytes', 0):>15,} {sum(s for _, s in layers.values()) * elem:>11,} "
                    f"{last.get('peak', 0):>18,} {max((t for t, _ in layers.values()), default=0) * elem:>14,} "
                    f"{gathers:>14} {scatters:>15} {'differ' if r in wrong else 'as one':>10}")
    return "\n".join(rows) + "\n    (in the last step: the gathers of the stage's first block, the reduce-scatters per " \
                             "block; gradients: each block's rebuilt from every rank's shard, against one process's)"


def prediction_line(path: str | None) -> str:
    """The graded prediction, each figure right or wrong as the grader judges it, a wrong one beside the figure of
    the default model's blocks (the run above has 2 blocks a stage on 2 ranks, m = 4)."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    head = (f"\n  your prediction, {FSDP_PREDICTION}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    {FSDP_PREDICTION_BLOCKS} blocks of {BLOCK_PARAMS:,} float32 parameters on {FSDP_PREDICTION_RANKS} "
            f"ranks, m = {FSDP_PREDICTION_M}: the bytes a rank holds, the gathers of one block in a step")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), FSDP_PREDICTION, FSDP_PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    return "\n".join([head] + verdict_lines(got, fsdp_wanted(), "it is"))


__all__ = ["check"]
