"""Visible check of q26 (mixed_precision_layer, with LossScaler): two cases on 2 ranks, 2 blocks of hidden size 16,
four steps each: one computed in bfloat16, one in float16 through the answer's LossScaler (growth every 2 clean steps)
with the lab's inf in rank 1's shard gradient at step 2. Judged by topics/mixed_precision/judge.py against one
process computing the same casts. It prints per case the bytes per element of each gather and reduce-scatter (what
the ring carried), the dtypes the answer keeps the shard and its gradient in, the largest differences from one
process, the scale after each step beside GradScaler's, and the prediction.

    report = check("q26")
    report.timeline()          # the fp16 run: each rank's steps, the gathers and reduce-scatters under them
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, CheckReport, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.mixed_precision.records import (
    BLOCK_PARAMS,
    PREDICTION_BLOCKS,
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_RANKS,
    prediction_wanted,
)

CFG = LabConfig(hidden_size=16, num_heads=2, seq_len=8, num_stages=1, seed=81)
CASES = [("bf16, n = 2", {"dtype": "bfloat16", "steps": 4}),
         ("fp16, n = 2, an inf in rank 1's gradient at step 2, growth every 2 steps",
          {"dtype": "float16", "steps": 4, "growth_interval": 2, "inject_step": 2, "inject_rank": 1})]


class MixedReport(CheckReport):
    def timeline(self, case: int | None = None):
        """The fp16 case unless a case is named (or one failed)."""
        if case is None and not any(self.problems):
            case = len(self.views) - 1 if self.views else None
        return super().timeline(case)


def check():
    from lab_src.topics.mixed_precision.judge import judge_run, replay
    srcs = sources("q26")
    cases = [make_case("mixed_precision", CFG.replace(seed=CFG.seed + i), srcs, "q26", stages=2, label=label,
                       settings=settings, step="", schedule="")
             for i, (label, settings) in enumerate(CASES)]
    run = run_cases(cases, run_dir("q26"))
    lines, problems = ["q26 mixed_precision_layer: 2 ranks, 2 blocks of 3,280 parameters, four SGD steps"], []
    for out in run.outcomes:
        label = out.case.label
        errs = errors(out, "q26", label)
        if errs:
            problems += errs
            lines += [f"\n  {label}: did not finish", UNFINISHED]
            continue
        found = judge_run(out)
        problems += [p for part in found.values() for p in stamped(part, "q26", label)]
        lines.append(case_lines(out, replay(out), found))
    lines.append(prediction_line(srcs.get("q26")))
    return finish("q26", run, problems, lines, cls=MixedReport)


def case_lines(out, ref, found) -> str:
    import torch

    from lab_src.harness.settings import settings_of
    from lab_src.topics.mixed_precision.judge import _ranks, _whole
    from lab_src.topics.mixed_precision.records import scale_trajectory
    s = settings_of(out.case)
    rows = [f"\n  {out.case.label}:",
            f"    {'rank':>4} {'gather B/elem':>14} {'reduce-scatter B/elem':>22} {'shard':>9} {'its grad':>9} "
            f"{'all-reduces':>12}"]
    for r in _ranks(out):
        step = (out.obs[r].get("steps") or [{}])[-1]
        g = step.get("gathers") or [[None, 0, 0]]
        sc = step.get("scatters") or [[0, 0]]
        rows.append(f"    {r:>4} {g[0][1] // max(1, g[0][2]):>14} {sc[0][0] // max(1, sc[0][1]):>22} "
                    f"{str(step.get('shard_dtype')):>9} {str(step.get('grad_dtype')):>9} "
                    f"{len(step.get('reduces') or []):>12}")
    diffs = []
    for k, want in enumerate(ref["train"]):
        got = _whole(out, k, "after")
        if got is not None:
            diffs.append(max(float((a - w.double()).abs().max()) for a, w in zip(got, want["after"])))
    grads = []
    for k, want in enumerate(ref["steps"]):
        got = _whole(out, k, "grad")
        if got is not None:
            fin = [torch.isfinite(w) for w in want["summed"]]
            grads.append(max(float((a - w.double()).abs()[f].max()) for a, w, f in zip(got, want["summed"], fin)))
    rows.append(f"    largest difference from one process: gradients per step {', '.join(f'{d:.2g}' for d in grads)}; "
                f"parameters after each step {', '.join(f'{d:.2g}' for d in diffs)}")
    if s.scaled:
        got = [st.get("scale") for st in out.obs[_ranks(out)[0]].get("steps") or []]
        rows.append(f"    loss scale after each step: {', '.join(f'{x:g}' if x else '-' for x in got)} (GradScaler's: "
                    f"{', '.join(f'{x:g}' for x in scale_trajectory(ref['found'], s.growth_interval))}; steps with an "
                    f"inf: {[k for k, f in enumerate(ref['found']) if f]})")
    rows.append("    " + "; ".join(f"{part}: {'right' if not ps else 'wrong (above)'}" for part, ps in found.items()))
    return "\n".join(rows)


def prediction_line(path: str | None) -> str:
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    {PREDICTION_BLOCKS} blocks of {BLOCK_PARAMS:,} parameters on {PREDICTION_RANKS} ranks, bfloat16: one "
            f"block's gather, a rank's float32 master shards, the same in bfloat16 alone")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    return "\n".join([head] + verdict_lines(got, prediction_wanted(), "it is"))


__all__ = ["check"]
