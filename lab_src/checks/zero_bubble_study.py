"""q16's measurement: your 1F1B step (q12) and your ZB-H1 step (q16) on 4 ranks of a model where compute
dominates messages, for m = 4, 8, 16 micro-batches, in one launch. For each run, its bubble with emulated
compute (views/emulated.py: the run's own order, each box the median of its kind, so that 4 ranks on a
2-core hub show their schedule's bubble) beside its theory, (p-1)/(m+p-1) for 1F1B and (p-1)(T_F+T_B-T_W) /
step for ZB-H1 with the T's of your own boxes (T_B: I, T_W: W); the wall-clock bubble of the same runs; and
the peak activation memory of both. Not graded: Validate and the grader skip it."""
from __future__ import annotations

import os
import sys

from lab_src.checks.common import CheckReport, make_case, run_cases, run_dir, study_sources
from lab_src.checks.experiments import study_held_back
from lab_src.harness.memory_release import released
from lab_src.judge.problems import stamped
from lab_src.judge.failures import case_problems
from lab_src.judge.summary import summary
from lab_src.pipeline.config import LabConfig
from lab_src.views import bubble, emulated
from lab_src.views.saved import case_view

QID, ONE_F_ONE_B = "q16", "q12"
# compute dominates: 8 blocks of width 256 over 128 tokens, so that a block's forward takes milliseconds
STUDY = LabConfig(num_layers=8, hidden_size=256, num_heads=8, seq_len=128, vocab_size=512, num_stages=4,
                  num_microbatches=4, global_batch_size=8)


class ZeroBubbleStudy(CheckReport):
    """The runs of `zero_bubble_study` (`timeline(i)`: 1F1B and ZB-H1 in turn for each m) and its `rows`."""


def ideal_bubbles(p: int, m: int) -> dict[str, float]:
    """The idle share of 1F1B and ZB-H1 in the schedule model with F, I and W boxes of one length each."""
    return {name: round(_model_bubble(p, m, 1.0, 1.0, 1.0, name), 4) for name in ("1f1b", "zbh1")}


def _model_bubble(p: int, m: int, t_f: float, t_i: float, t_w: float, schedule: str = "zbh1") -> float:
    """A schedule's bubble in the schedule model (views/ideal.py) with these box lengths and free messages
    (1F1B's backward is one box of t_i + t_w)."""
    from lab_src.views.ideal import CostModel, ideal_events
    cost = CostModel(forward_s_per_layer=t_f, backward_s_per_layer=t_i + t_w, input_share=t_i / (t_i + t_w),
                     latency_s=0.0, bandwidth_bytes_per_s=1e30)
    return bubble.measured_bubble(ideal_events(p, m, cost, schedule=schedule), p) or 0.0


def _pct(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.1%}"


@released
def zero_bubble_study(ms=(4, 8, 16), stages: int | None = None, cfg: LabConfig = STUDY) -> ZeroBubbleStudy | None:
    """Run your q12 and q16 steps for each m in `ms` on `cfg` and print the bubbles and the memory.
    `stages`: ranks (default 4, whatever the cores: the emulated columns do not depend on them)."""
    if study_held_back(QID, "The zero-bubble study", "open the notebook and run `study = zero_bubble_study()`",
                       "The study runs your step"):
        return None
    p = stages or 4
    srcs = study_sources(ONE_F_ONE_B, QID)
    if srcs is None:
        return None
    runs = [(cfg.replace(num_stages=p, num_microbatches=p, global_batch_size=2 * p), QID)]  # warm-up
    runs += [(cfg.replace(num_stages=p, num_microbatches=m, global_batch_size=2 * m), q) for m in ms
             for q in (ONE_F_ONE_B, QID)]
    cases = [make_case("pipeline", c, srcs, QID, step=q, schedule="1f1b" if q == ONE_F_ONE_B else "zbh1",
                       label=f"{'1F1B' if q == ONE_F_ONE_B else 'ZB-H1'}, m = {c.num_microbatches}") for c, q in runs]
    run = run_cases(cases, run_dir(QID + "-study"), case_deadline_s=180, timeout_s=60)
    run.outcomes = run.outcomes[1:]
    cores = os.cpu_count() or 1
    lines = [f"{QID} zero-bubble study: {p} ranks on {cores} cores, {cfg.num_layers} blocks of width "
             f"{cfg.hidden_size}, micro-batches of 2 x {cfg.seq_len} tokens",
             f"  {'':>3}  {'emulated compute':^14}  {'schedule model':^14}  {'measured':^14}",
             f"  {'m':>3}  {'1F1B':>6}  {'ZB-H1':>6}  {'1F1B':>6}  {'ZB-H1':>6}  {'1F1B':>6}  {'ZB-H1':>6}  "
             f"{'T_F':>6}  {'T_I':>6}  {'T_W':>6}  {'peak activations, 1F1B / ZB-H1':>32}"]
    rows, problems, views = [], [], []
    for i, m in enumerate(ms):
        pair = run.outcomes[2 * i: 2 * i + 2]
        pair_views = [case_view(out) for out in pair]
        errs = [q for out in pair for q in stamped(case_problems(out), QID, out.case.label)]
        if errs:
            problems += errs
            views += pair_views
            continue
        (fb, zb) = [out.events() for out in pair]
        # one cost model for both runs, from the ZB-H1 run's boxes: a 1F1B backward is its I and its W
        times = emulated.box_times(zb)
        t_f, t_b, t_w = (times.get(k, 0.0) for k in ("forward", "backward_input", "backward_weight"))
        both = {"zbh1": times, "1f1b": {"forward": t_f, "backward": t_b + t_w}}
        emu = {name: emulated.emulated_events(ev, p, both[name]) for name, ev in (("1f1b", fb), ("zbh1", zb))}
        for view, name in zip(pair_views, ("1f1b", "zbh1")):
            view["emulate"] = both[name]
        views += pair_views
        peaks = [max((o.get("memory") or {}).get("peak_saved_bytes") or 0 for o in out.obs.values()) for out in pair]
        row = {"m": m, "emulated_1f1b": bubble.measured_bubble(emu["1f1b"] or [], p),
               "theory_1f1b": bubble.theoretical_bubble(p, m),
               "emulated_zbh1": bubble.measured_bubble(emu["zbh1"] or [], p),
               "model_zbh1": _model_bubble(p, m, t_f, t_b, t_w),
               "bubble_1f1b": bubble.measured_bubble(fb, p), "bubble_zbh1": bubble.measured_bubble(zb, p),
               "t_f": t_f, "t_b": t_b, "t_w": t_w, "peak_1f1b": peaks[0], "peak_zbh1": peaks[1]}
        rows.append(row)
        lines.append(f"  {m:>3}  {_pct(row['emulated_1f1b'])}  {_pct(row['emulated_zbh1'])}  {row['theory_1f1b']:6.1%}  "
                     f"{row['model_zbh1']:6.1%}  {_pct(row['bubble_1f1b'])}  {_pct(row['bubble_zbh1'])}  "
                     f"{t_f * 1e3:4.1f}ms  {t_b * 1e3:4.1f}ms  {t_w * 1e3:4.1f}ms  "
                     f"{peaks[0] / 2**20:12.1f} / {peaks[1] / 2**20:.1f} MiB ({peaks[1] / max(peaks[0], 1):.2f} x)")
    lines += [
        "  emulated compute: each run's own operations, in the order your step ran them, with every F, I and W box "
        "the median of the ZB-H1 run's boxes of its kind (a 1F1B backward is one I and one W) and messages at the "
        "cost model's price: the bubble your schedule makes, whatever else the machine runs",
        "  schedule model: the schedule itself with the same box lengths (views/ideal.py): (p-1)/(m+p-1) for 1F1B; "
        "for ZB-H1 it depends on T_F, T_I and T_W (the paper's (p-1)(T_F+T_I-T_W) / step, Table 2, agrees with it "
        "when the three boxes are equal and drifts from it when they are not). Where your emulated column equals "
        "the model's, your step runs the schedule's order",
        f"  measured: the wall clock of the same runs. {p} ranks share {cores} cores here, so a rank also waits for "
        f"a core, not only for a message: its boxes stretch and the idle time moves from run to run"
        if cores < p else "  measured: the wall clock of the same runs, messages and Python between boxes included"]
    if not rows:
        lines.append(f"  no pair of runs finished, so there is nothing to compare:\n{summary(problems, 3)}")
    print("\n".join(lines), file=sys.stderr if not rows else sys.stdout)
    study = ZeroBubbleStudy(QID, run, problems, lines, views=views)
    study.rows = rows
    return study.let_go()       # the views and rows stay; every rank's records go
