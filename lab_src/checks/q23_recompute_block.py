"""Visible check of q23 (recompute_block): the answer's three modes on the lab's block (dropout on) at the graded
prediction's shape in bfloat16, then on a float32 block, one rank each, judged by topics/long_sequences/judge.py:
the gradients over micro-batches in flight against the plain block's, the bytes kept against each mode's closed form,
the recomputed matmul FLOPs. It prints per mode what the lab measured beside the closed form and the paper's, and the
prediction beside the figures it is judged against. Then the answer cell's `sp_block` (sequence parallelism on the
tensor-parallel block) on t = 2 and t = 4 ranks in float64, dropout off and on, and in bfloat16 at the prediction's
shape on t = 4 ranks, judged by topics/long_sequences/judge_sp.py: values against one process's block, the replicated
parameters' gradients summed over the ranks, each rank's saved bytes against the closed form, its all-gathers and
reduce-scatters; and the second prediction.

    report = check("q23")
    kept_figure(report)        # the bytes each mode kept, measured beside the prediction and the paper's
    sp_figure(report)          # the bytes each sequence-parallel rank kept, beside the closed forms
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, CheckReport, errors, finish, make_case, nothing_to_draw, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.records import (
    ITEMSIZE,
    MODES,
    SP_PREDICTION_KEYS,
    SP_PREDICTION_NAME,
    SP_PREDICTION_T,
    PREDICTION_DTYPE,
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_SHAPE,
    forward_flops,
    kept_bytes,
    paper_bytes,
    prediction_wanted,
    sp_kept_bytes,
    sp_prediction_wanted,
    sp_traffic,
    tp_kept_bytes,
)

P = PREDICTION_SHAPE
CASES = [(f"{PREDICTION_DTYPE}, b = {P['b']}, s = {P['s']}, h = {P['h']}, {P['a']} heads (the prediction's shape)",
          LabConfig(hidden_size=P["h"], num_heads=P["a"], seq_len=P["s"], dropout=0.1, seed=31, num_stages=1),
          {"batch": P["b"], "dtype": PREDICTION_DTYPE}),
         ("float32, b = 2, s = 128, h = 64, 4 heads",
          LabConfig(hidden_size=64, num_heads=4, seq_len=128, dropout=0.1, seed=32, num_stages=1),
          {"batch": 2, "dtype": "float32"})]

# sequence parallelism (sp_block): label -> (configuration, ranks, settings)
SP_CASES = {
    "sp_block, t = 2, float64": (LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64",
                                           seed=33), 2, {}),
    "sp_block, t = 4, float64": (LabConfig(num_stages=4, global_batch_size=4, num_microbatches=2, dtype="float64",
                                           seed=34), 4, {}),
    f"sp_block, t = {SP_PREDICTION_T}, {PREDICTION_DTYPE}, the prediction's shape": (
        LabConfig(hidden_size=P["h"], num_heads=P["a"], seq_len=P["s"], global_batch_size=P["b"], num_microbatches=1,
                  num_stages=SP_PREDICTION_T, seed=35), SP_PREDICTION_T,
        {"parts": ["dropout"], "dtype": PREDICTION_DTYPE, "values": False}),
}
SP_FIGURE_CASE = f"sp_block, t = {SP_PREDICTION_T}, {PREDICTION_DTYPE}, the prediction's shape"
SP_TRAIN_CASE = "the digits model trained with sp_block, t = 2, dropout 0.1, 20 steps"


class RecomputeReport(CheckReport):
    """A check report that also holds the bytes each mode kept in the first case's run, and the prediction."""
    kept: dict = {}
    predicted: dict = {}
    sp_kept: dict = {}            # rank -> bytes saved in the bfloat16 sequence-parallel run
    sp_predicted: dict = {}

    def timeline(self, case=None):
        print("q23's recomputation runs on one rank and sends nothing: kept_figure(report) draws what it kept, "
              "sp_figure(report) what each sequence-parallel rank kept.")


def kept_figure(report):
    """The bytes each mode kept in the check's bfloat16 run, beside the prediction and the paper's; of any report
    (one skipped while autograding, or stopped by a missing answer, draws nothing and says why)."""
    from lab_src.topics.long_sequences.figure import kept_bars
    kept = getattr(report, "kept", None)
    if not kept:
        print(nothing_to_draw(report))
        return None
    return kept_bars(kept, getattr(report, "predicted", {}), tuple(P[k] for k in "bsha"), PREDICTION_DTYPE)


def sp_figure(report):
    """The bytes each rank of the check's bfloat16 sequence-parallel run saved, beside the closed forms (one process,
    tensor parallel, sequence parallel) and the second prediction; of any report (draws nothing and says why when
    there is nothing to draw)."""
    from lab_src.topics.long_sequences.figure import sp_bars
    kept = getattr(report, "sp_kept", None)
    if not kept:
        print(nothing_to_draw(report))
        return None
    return sp_bars(kept, getattr(report, "sp_predicted", {}), (P["b"], P["s"], P["h"], P["a"], SP_PREDICTION_T),
                   PREDICTION_DTYPE)


def check():
    from lab_src.topics.long_sequences.judge import flat, judge_run
    srcs = sources("q23")
    from lab_src.topics.long_sequences.judge_sp import judge_sp
    cases = [make_case("recompute", cfg, srcs, "q23", stages=1, label=label, settings=settings, schedule="", step="")
             for label, cfg, settings in CASES]
    cases += [make_case("sp_block", cfg, srcs, "q23", stages=t, label=label, settings=settings)
              for label, (cfg, t, settings) in SP_CASES.items()]
    from lab_src.topics.training.digits import DIGITS
    cases.append(make_case("sp_train", DIGITS.replace(num_stages=1, dropout=0.1, dropout_shards=2), srcs, "q23",
                           stages=2, label=SP_TRAIN_CASE, settings={"steps": 20, "lr": 1e-2}))
    run = run_cases(cases, run_dir("q23"))
    problems, lines = [], ["q23 recompute_block: each mode on the lab's block, dropout 0.1, training mode"]
    kept, sp_kept = {}, {}
    for i, out in enumerate(run.outcomes):
        lines.append(f"\n  {out.case.label}")
        errs = errors(out, "q23", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        if out.case.kind == "sp_train":
            from lab_src.topics.long_sequences.judge_sp import sp_training, training_line
            problems += stamped(sp_training(out), "q23", out.case.label)
            lines.append(training_line(out))
            continue
        if out.case.kind == "sp_block":
            problems += stamped([p for ps in judge_sp(out).values() for p in ps], "q23", out.case.label)
            lines.append(sp_table(out))
            if out.case.label == SP_FIGURE_CASE:
                sp_kept = {r: (((o.get("parts") or {}).get("dropout") or {}).get("saved") or {}).get("bytes")
                           for r, o in sorted(out.obs.items())}
            continue
        found = judge_run(out)
        problems += stamped(flat(found), "q23", out.case.label)
        lines.append(table(out, found))
        if i == 0:
            o = out.obs.get(0) or {}
            kept = {m: ((o.get("modes") or {}).get(m) or {}).get("kept", {}).get("bytes") for m in MODES}
    predicted, said = prediction(srcs.get("q23"))
    lines.append(said)
    sp_predicted, said = prediction(srcs.get("q23"), sp=True)
    lines.append(said)
    report = finish("q23", run, problems, lines, cls=RecomputeReport, views=[])
    report.kept = {m: v for m, v in kept.items() if v}
    report.predicted = predicted
    report.sp_kept = {r: v for r, v in sp_kept.items() if v}
    report.sp_predicted = sp_predicted
    return report


def sp_table(out) -> str:
    """Per part and rank: the bytes saved beside the closed forms, and the collectives of each direction."""
    rows = [f"    {'part':>8} {'rank':>4} {'saved (B)':>11} {'SP form':>11} {'TP form':>11}  forward / backward "
            f"collectives (count x bytes)"]
    for part in (out.case.settings or {}).get("parts") or ("block", "dropout"):
        for r, o in sorted(out.obs.items()):
            rec = (o.get("parts") or {}).get(part) or {}
            if rec.get("raised") or not rec.get("shape"):
                rows.append(f"    {part:>8} {r:>4}  raised" if rec.get("raised") else f"    {part:>8} {r:>4}  -")
                continue
            b, s, h, a, e, t = rec["shape"]
            saved = (rec.get("saved") or {}).get("bytes")
            forms = (f"{sp_kept_bytes(b, s, h, a, e, t):>11,} {tp_kept_bytes(b, s, h, a, e, t):>11,}"
                     if part == "dropout" else f"{'-':>11} {'-':>11}")
            rows.append(f"    {part:>8} {r:>4} {(f'{saved:,}' if saved is not None else '-'):>11} {forms}  "
                        f"{_counted(rec.get('forward'))} / {_counted(rec.get('backward'))}")
    b, s, h, a, e, t = next((((o.get("parts") or {}).get(p) or {}).get("shape") or [0] * 6
                             for o in out.obs.values() for p in ("dropout", "block")), [0] * 6)
    if t:
        want = sp_traffic(b, s, h, e, t)
        rows.append(f"    the formula, per rank: forward {_counted([[k, n] for k, v in want['forward'].items() for n in v])}"
                    f" / backward {_counted([[k, n] for k, v in want['backward'].items() for n in v])} and the "
                    f"replicated gradients' all-reduces")
    return "\n".join(rows)


def _counted(calls) -> str:
    from collections import Counter
    names = {"all_gather": "AG", "reduce_scatter": "RS", "all_reduce": "AR"}
    got = Counter((names.get(c[0], c[0]), c[1]) for c in calls or [])
    return ", ".join(f"{k} {n} x {b:,}" for (k, b), n in sorted(got.items())) or "none"


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


def prediction(path: str | None, sp: bool = False) -> tuple[dict, str]:
    """The graded prediction (each number right or wrong as the grader judges it), and what the check prints; `sp`:
    the second one, per rank under tensor and sequence parallelism."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    name, keys, wanted = ((SP_PREDICTION_NAME, SP_PREDICTION_KEYS, sp_prediction_wanted()) if sp else
                          (PREDICTION_NAME, PREDICTION_KEYS, prediction_wanted()))
    head = (f"\n  your prediction, {name}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    bytes kept for the backward, b = {P['b']}, s = {P['s']}, h = {P['h']}, {P['a']} heads, "
            f"{PREDICTION_DTYPE}, dropout on" + (f", per rank of t = {SP_PREDICTION_T}" if sp else ""))
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), name, keys) if path else {}
    except NotANumber as e:
        return {}, head + f"\n    could not be read: {e}"
    return got, "\n".join([head] + verdict_lines(got, wanted, "it is"))


__all__ = ["check", "kept_figure", "sp_figure"]
