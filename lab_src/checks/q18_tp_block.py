"""Visible check of q18 (tp_block): the answer's tensor-parallel block on 2 ranks and on 4, in float64,
against the unsharded block of the lab's model (judge/tp_block.py), dropout off and then on: the output,
the input's gradient, every shard's gradients, the collectives of the forward and the backward, and the
replicated LayerNorms after one AdamW step (equal on every rank, and the single process's).

    report = check("q18")
    report.timeline()          # the 4-rank run: every collective, on a measured time axis
"""
from __future__ import annotations

from lab_src.checks.common import UNFINISHED, CheckReport, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.checks.q17_tp_layers import TPReport
from lab_src.pipeline.config import LabConfig

CONFIGS = [(2, LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64")),
           (4, LabConfig(num_stages=4, global_batch_size=4, num_microbatches=2, dtype="float64", seed=5))]
PARTS = ("block", "dropout")


class BlockReport(TPReport):
    parts = PARTS


def check() -> CheckReport:
    from lab_src.judge.problems import stamped
    from lab_src.judge.tp import _rounds_text
    from lab_src.judge.tp_block import WHAT, judge_part
    srcs = sources("q18")
    cases = [make_case("tp_block", cfg, srcs, "q18", stages=t, label=f"t = {t}") for t, cfg in CONFIGS]
    run = run_cases(cases, run_dir("q18"))
    problems, lines = [], ["q18 tp_block: the block on t ranks against the unsharded block (float64, to 1e-10)"]
    for (t, cfg), out in zip(CONFIGS, run.outcomes):
        label = f"t = {t}"
        lines.append(f"\n  {label}: {cfg.num_heads} heads, {cfg.num_heads // t} per rank")
        errs = errors(out, "q18", label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        for part in PARTS:
            found = judge_part(part, out)
            mine = stamped(found["holds"] + found["numbers"] + found["replicated"] + found["communication"],
                           "q18", label)
            problems += mine
            got = (out.obs.get(0, {}).get("tp_block") or {}).get(part) or {}
            verdict = "matches the unsharded block" if not (found["numbers"] or found["holds"]) else "see the problems"
            norms = "equal on every rank" if not found["replicated"] else "see the problems"
            lines.append(f"    {WHAT[part]}: {verdict}; LayerNorms after a step: {norms}")
            lines.append(f"      rank 0's forward: {_rounds_text(got.get('fwd') or [])}; "
                         f"backward: {_rounds_text(got.get('bwd') or [])}")
        got = (out.obs.get(0, {}).get("tp_block") or {}).get("block") or {}
        if got.get("params") is not None:
            lines.append(f"      rank 0 holds qkv {tuple(got.get('qkv_weight_shape') or ())}, proj "
                         f"{tuple(got.get('proj_weight_shape') or ())}: {got['params']:,} parameter elements")
    views = [{"events": o.events(recovered=True), "stages": o.case.stages, "microbatches": 1,
              "title": f"q18: {o.case.label}, every collective of each rank"} for o in run.outcomes]
    return finish("q18", run, problems, lines, views=views, cls=BlockReport)


__all__ = ["check"]
