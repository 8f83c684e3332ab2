"""Visible check of q24 (ring_attention, and ulysses_attention beside it in the answer cell): one launch of 4 ranks
and one of 3, judged by topics/long_sequences/judge_attention.py: the outputs and dq, dk, dv against torch's
scaled_dot_product_attention on one process (float64), the messages (neighbours, bytes per rank against the
formulas, the next block's receive posted before computing), and the work each rank's forward computed. It prints,
per run, the bytes each rank sent beside the formula and each rank's work in blocks (S/N queries by S/N keys)
beside the layout's balance.

    report = check("q24")
    blocks_figure(report)      # the zigzag and contiguous runs' blocks over time per rank, with each rank's work
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import (
    UNFINISHED,
    CheckReport,
    errors,
    finish,
    kind_view,
    make_case,
    nothing_to_draw,
    run_cases,
    run_dir,
    sources,
)
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.records import (
    PREDICTION_Q24,
    PREDICTION_Q24_KEYS,
    PREDICTION_Q24_SHAPE,
    prediction_q24_wanted,
)


def ring(layout: str, causal: bool = True, seq: int = 32, heads: int = 4, dim: int = 8) -> dict:
    return {"fn": "ring", "layout": layout, "causal": causal, "seq": seq, "heads": heads, "dim": dim}


def ulysses(causal: bool = True, seq: int = 32, heads: int = 4, dim: int = 8) -> dict:
    return {"fn": "ulysses", "causal": causal, "seq": seq, "heads": heads, "dim": dim}


# (label, ranks, settings): the ring's runs first, Ulysses last (an answer that has only the ring keeps its ring runs)
# (the first run of a launch also opens gloo's connections between the ranks: the figure draws later ones)
CASES = [("N = 4", 4, {"runs": [ring("contiguous", causal=False), ring("contiguous"), ring("zigzag"),
                                ring("zigzag", seq=29), ulysses(), ulysses(heads=2)]}),
         ("N = 3", 3, {"runs": [ring("zigzag", seq=25, heads=3), ring("contiguous", seq=25, heads=3),
                                ulysses(seq=25, heads=6)]})]


class AttentionReport(CheckReport):
    """A check report that also knows the runs its figure draws."""
    drawn: list = []


def blocks_figure(report):
    """The first case's contiguous and zigzag causal runs, their blocks over time per rank; of any report (one skipped
    while autograding, or stopped by a missing answer, draws nothing and says why)."""
    from lab_src.topics.long_sequences.figure_attention import blocks_figure as draw
    drawn = getattr(report, "drawn", None)
    fig = draw(drawn) if drawn else None
    if fig is None:
        print(nothing_to_draw(report))
    return fig


def check():
    from lab_src.topics.long_sequences.judge_attention import flat, judge_run, run_label
    srcs = sources("q24")
    cases = [make_case("attention", LabConfig(num_stages=n, seed=40 + n), srcs, "q24", stages=n, label=label,
                       settings=settings, schedule="", step="") for label, n, settings in CASES]
    run = run_cases(cases, run_dir("q24"))
    problems, lines, drawn = [], ["q24 ring_attention and ulysses_attention: each run against one process's "
                                  "scaled_dot_product_attention (float64)"], []
    for out in run.outcomes:
        lines.append(f"\n  {out.case.label}")
        errs = errors(out, "q24", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        found = judge_run(out)
        problems += stamped(flat(found), "q24", out.case.label)
        lines.append(table(out, found))
        if not drawn:
            runs = out.case.settings["runs"]
            drawn = [(out, i, f"{out.case.label}, {run_label(r)}") for i, r in enumerate(runs)
                     if r["fn"] == "ring" and r["causal"] and r["seq"] == 32]
    lines.append(prediction(srcs.get("q24")))
    views = [kind_view(o) for o in run.outcomes]
    report = finish("q24", run, problems, lines, cls=AttentionReport, views=views)
    report.drawn = drawn
    return report


def table(out, found) -> str:
    from lab_src.topics.long_sequences.judge_attention import traffic

    def span(d: dict) -> str:
        v = sorted(d.values())
        return f"{v[0]:,.0f}" if v[0] == v[-1] else f"{v[0]:,.0f}-{v[-1]:,.0f}"
    rows = [f"    {'run':<44} {'fwd sent/rank (B)':>18} {'formula':>9} {'bwd sent/rank (B)':>18} {'formula':>9} "
            f"{'blocks per rank':>15} {'max/mean':>8} {'layout':>6}  verdict"]
    for row in traffic(out):
        label = row["label"]
        bad = [p for part in found.values() for p in part.get(label, [])]
        work = ""
        if row["run"]["fn"] == "ring":
            from lab_src.harness.settings import settings_of
            from lab_src.topics.long_sequences.records import tile_flops
            block = tile_flops(row["run"], out.case.stages, settings_of(out.case).batch) * \
                (4 if row["run"]["layout"] == "zigzag" else 1)          # S/N queries by S/N keys
            work = " ".join(f"{w / block:g}" for _, w in sorted(row["work"].items()))
        bal = f"{row['balance']:.2f}" if row["balance"] and row["run"]["fn"] == "ring" else "-"
        want_bal = f"{row['want_balance']:.2f}" if row["want_balance"] else "-"
        rows.append(f"    {label:<44} {span(row['forward']):>18} {row['want_forward']:>9,.0f} "
                    f"{span(row['backward']):>18} {row['want_backward']:>9,.0f} {work:>15} {bal:>8} {want_bal:>6}  "
                    f"{'right' if not bad else 'wrong'}")
    for run in out.case.settings["runs"]:
        if run["fn"] == "ulysses" and (out.case.stages > run["heads"] or run["heads"] % out.case.stages):
            from lab_src.topics.long_sequences.judge_attention import run_label
            bad = found["values"].get(run_label(run))
            rows.append(f"    {run_label(run):<44} must raise ValueError naming P = {out.case.stages} and the "
                        f"{run['heads']} heads: {'wrong' if bad else 'right'}")
    return "\n".join(rows)


def prediction(path: str | None) -> str:
    """The graded prediction, each number right or wrong as the grader judges it."""
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    p = PREDICTION_Q24_SHAPE
    head = (f"\n  your prediction, {PREDICTION_Q24}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    one sequence of S = {p['seq']:,}, {p['heads']} heads of {p['dim']}, bfloat16, N = P = {p['ranks']} "
            f"ranks: bytes one rank sends in the forward (ring, Ulysses); busiest rank's causal work over the mean "
            f"(contiguous, zigzag)")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_Q24, PREDICTION_Q24_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    return "\n".join([head] + verdict_lines(got, prediction_q24_wanted(), "it is"))


__all__ = ["check", "blocks_figure"]
