"""Visible check of q23 (recompute_block): the answer's three modes on the lab's block (dropout on) at the graded
prediction's shape in bfloat16, then on a float32 block, one rank each, judged by topics/long_sequences/judge.py:
the gradients over micro-batches in flight against the plain block's, the bytes kept against each mode's closed form,
the recomputed matmul FLOPs. It prints per mode what the lab measured beside the closed form and the paper's, and the
prediction beside the figures it is judged against.

    report = check("q23")
    kept_figure(report)        # the bytes each mode kept, measured beside the prediction and the paper's
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, CheckReport, errors, finish, make_case, nothing_to_draw, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.records import (
    ITEMSIZE,
    MODES,
    PREDICTION_DTYPE,
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_SHAPE,
    forward_flops,
    kept_bytes,
    paper_bytes,
    prediction_wanted,
)

P = PREDICTION_SHAPE
CASES = [(f"{PREDICTION_DTYPE}, b = {P['b']}, s = {P['s']}, h = {P['h']}, {P['a']} heads (the prediction's shape)",
          LabConfig(hidden_size=P["h"], num_heads=P["a"], seq_len=P["s"], dropout=0.1, seed=31, num_stages=1),
          {"batch": P["b"], "dtype": PREDICTION_DTYPE}),
         ("float32, b = 2, s = 128, h = 64, 4 heads",
          LabConfig(hidden_size=64, num_heads=4, seq_len=128, dropout=0.1, seed=32, num_stages=1),
          {"batch": 2, "dtype": "float32"})]


class RecomputeReport(CheckReport):
    """A check report that also holds the bytes each mode kept in the first case's run, and the prediction."""
    kept: dict = {}
    predicted: dict = {}

    def timeline(self, case=None):
        print("q23 runs on one rank and sends nothing: kept_figure(report) draws what it kept.")


def kept_figure(report):
    """The bytes each mode kept in the check's bfloat16 run, beside the prediction and the paper's; of any report
    (one skipped while autograding, or stopped by a missing answer, draws nothing and says why)."""
    from lab_src.topics.long_sequences.figure import kept_bars
    kept = getattr(report, "kept", None)
    if not kept:
        print(nothing_to_draw(report))
        return None
    return kept_bars(kept, getattr(report, "predicted", {}), tuple(P[k] for k in "bsha"), PREDICTION_DTYPE)


def check():
    from lab_src.topics.long_sequences.judge import flat, judge_run
    srcs = sources("q23")
    cases = [make_case("recompute", cfg, srcs, "q23", stages=1, label=label, settings=settings, schedule="", step="")
             for label, cfg, settings in CASES]
    run = run_cases(cases, run_dir("q23"))
    problems, lines = [], ["q23 recompute_block: each mode on the lab's block, dropout 0.1, training mode"]
    kept = {}
    for i, out in enumerate(run.outcomes):
        lines.append(f"\n  {out.case.label}")
        errs = errors(out, "q23", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        found = judge_run(out)
        problems += stamped(flat(found), "q23", out.case.label)
        lines.append(table(out, found))
        if i == 0:
            o = out.obs.get(0) or {}
            kept = {m: ((o.get("modes") or {}).get(m) or {}).get("kept", {}).get("bytes") for m in MODES}
    predicted, said = prediction(srcs.get("q23"))
    lines.append(said)
    report = finish("q23", run, problems, lines, cls=RecomputeReport, views=[])
    report.kept = {m: v for m, v in kept.items() if v}
    report.predicted = predicted
    return report


def table(out, found) -> str:
    from lab_src.harness.settings import settings_of
    from lab_src.topics.long_sequences.records import shape_of
    settings = settings_of(out.case)
    b, s, h, a = shape_of(out.case.config, settings)
    e = ITEMSIZE[settings.dtype]
    o = out.obs.get(0) or {}
    f3 = 3 * forward_flops(b, s, h)

    def n(v) -> str:
        return "-" if v is None else f"{v:,}"
    rows = [f"    {'mode':>9} {'kept (B)':>11} {'closed form':>12} {'paper':>14} {'matmul FLOPs':>13} "
            f"{'vs plain':>8} {'fwd+bwd (ms)':>12} {'numbers':>9}"]
    for mode in MODES:
        rec = (o.get("modes") or {}).get(mode) or {}
        kept = (rec.get("kept") or {}).get("bytes")
        flops = rec.get("flops") or {}
        total = flops.get("forward", 0) + flops.get("backward", 0) if flops else None
        ms = 1e3 * (flops.get("forward_s", 0) + flops.get("backward_s", 0)) if flops else None
        paper = paper_bytes(b, s, h, a, mode) * e // 2
        differ = bool(found["gradients"].get(mode))
        verdict = "raised" if rec.get("raised") else ("differ" if differ else "as plain")
        rows.append(f"    {mode:>9} {n(kept):>11} {kept_bytes(b, s, h, a, e, mode):>12,} "
                    f"{paper:>14,} {n(total):>13} "
                    f"{(f'{total / f3:.3f}x' if total else '-'):>8} {(f'{ms:.0f}' if ms is not None else '-'):>12} "
                    f"{verdict:>9}")
    return "\n".join(rows)


def prediction(path: str | None) -> tuple[dict, str]:
    """The graded prediction (each number right or wrong as the grader judges it), and what the check prints."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    bytes kept for the backward, b = {P['b']}, s = {P['s']}, h = {P['h']}, {P['a']} heads, "
            f"{PREDICTION_DTYPE}, dropout on")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return {}, head + f"\n    could not be read: {e}"
    return got, "\n".join([head] + verdict_lines(got, prediction_wanted(), "it is"))


__all__ = ["check", "kept_figure"]
