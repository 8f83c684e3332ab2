"""q16's measurement: your 1F1B step (q12) and your ZB-H1 step (q16) on a model where compute dominates
messages, for m = 4, 8, 16 micro-batches, in one launch: the measured bubble of each beside its theory,
(p-1)/(m+p-1) for 1F1B and (p-1)(T_F+T_B-T_W) / step for ZB-H1 with the T's measured from your own boxes
(T_B: I, T_W: W), and the peak activation memory of both. Not graded: Validate and the grader skip it."""
from __future__ import annotations

import os
import sys

from lab_src.checks.common import CheckReport, autograding, make_case, run_cases, run_dir, study_sources
from lab_src.checks.experiments import skipped_under_validate
from lab_src.grading import check_not_passed
from lab_src.judge.problems import stamped
from lab_src.judge.failures import case_problems
from lab_src.judge.summary import summary
from lab_src.pipeline.config import LabConfig
from lab_src.views import bubble

QID, ONE_F_ONE_B = "q16", "q12"
# compute dominates: 8 blocks of width 256 over 128 tokens, so that a block's forward takes milliseconds
STUDY = LabConfig(num_layers=8, hidden_size=256, num_heads=8, seq_len=128, vocab_size=512, num_stages=4,
                  num_microbatches=4, global_batch_size=8)


class ZeroBubbleStudy(CheckReport):
    """The runs of `zero_bubble_study` (`timeline(i)`: 1F1B and ZB-H1 in turn for each m) and its `rows`."""


def _mean(events, kind: str) -> float:
    boxes = [e.t_end - e.t_start for e in events if e.kind == kind]
    return sum(boxes) / len(boxes) if boxes else 0.0


def ideal_bubbles(p: int, m: int) -> dict[str, float]:
    """The idle share of 1F1B and ZB-H1 in the schedule model with F, I and W boxes of one length each."""
    from lab_src.views.ideal import CostModel, ideal_events
    equal = CostModel(forward_s_per_layer=1.0, backward_s_per_layer=2.0, latency_s=0.0, bandwidth_bytes_per_s=1e30)
    return {name: round(bubble.measured_bubble(ideal_events(p, m, equal, schedule=name), p), 4)
            for name in ("1f1b", "zbh1")}


def zero_bubble_study(ms=(4, 8, 16), stages: int | None = None, cfg: LabConfig = STUDY) -> ZeroBubbleStudy | None:
    """Run your q12 and q16 steps for each m in `ms` on `cfg` and print the bubbles and the memory.
    `stages`: ranks (default 4, or 2 on a machine with fewer than 4 cores, so that ranks do not share one)."""
    if autograding():
        print("The zero-bubble study is skipped while autograding.")
        return None
    if skipped_under_validate("The zero-bubble study", "open the notebook and run `study = zero_bubble_study()`"):
        return None
    not_passed = check_not_passed(QID)
    if not_passed:
        print(f"The study runs your step, and the check above did not pass: make it pass first.\n"
              f"  {not_passed.splitlines()[0]}", file=sys.stderr)
        return None
    stages = stages or (4 if (os.cpu_count() or 1) >= 4 else 2)
    srcs = study_sources(ONE_F_ONE_B, QID)
    if srcs is None:
        return None
    runs = [(cfg.replace(num_stages=stages, num_microbatches=stages, global_batch_size=2 * stages), QID)]  # warm-up
    runs += [(cfg.replace(num_stages=stages, num_microbatches=m, global_batch_size=2 * m), q) for m in ms
             for q in (ONE_F_ONE_B, QID)]
    cases = [make_case("pipeline", c, srcs, QID, step=q, schedule="1f1b" if q == ONE_F_ONE_B else "zbh1",
                       label=f"{'1F1B' if q == ONE_F_ONE_B else 'ZB-H1'}, m = {c.num_microbatches}") for c, q in runs]
    run = run_cases(cases, run_dir(QID + "-study"), case_deadline_s=180, timeout_s=60)
    run.outcomes = run.outcomes[1:]
    p = stages
    lines = [f"{QID} zero-bubble study: {p} ranks, {cfg.num_layers} blocks of width {cfg.hidden_size}, micro-batches "
             f"of 2 x {cfg.seq_len} tokens",
             f"  {'m':>3}  {'1F1B':>6}  {'theory':>6}  {'ZB-H1':>6}  {'theory':>6}  {'T_F':>6}  {'T_B(I)':>6}  "
             f"{'T_W':>6}  {'peak activations, 1F1B / ZB-H1':>32}"]
    rows, problems = [], []
    for i, m in enumerate(ms):
        pair = run.outcomes[2 * i: 2 * i + 2]
        errs = [q for out in pair for q in stamped(case_problems(out), QID, out.case.label)]
        if errs:
            problems += errs
            continue
        (fb, zb) = [out.events() for out in pair]
        t_f, t_b, t_w = _mean(zb, "forward"), _mean(zb, "backward_input"), _mean(zb, "backward_weight")
        peaks = [max((o.get("memory") or {}).get("peak_saved_bytes") or 0 for o in out.obs.values()) for out in pair]
        row = {"m": m, "bubble_1f1b": bubble.measured_bubble(fb, p), "theory_1f1b": bubble.theoretical_bubble(p, m),
               "bubble_zbh1": bubble.measured_bubble(zb, p), "theory_zbh1": bubble.zero_bubble_theory(p, m, t_f, t_b, t_w),
               "t_f": t_f, "t_b": t_b, "t_w": t_w, "peak_1f1b": peaks[0], "peak_zbh1": peaks[1]}
        rows.append(row)
        lines.append(f"  {m:>3}  {row['bubble_1f1b']:6.1%}  {row['theory_1f1b']:6.1%}  {row['bubble_zbh1']:6.1%}  "
                     f"{row['theory_zbh1']:6.1%}  {t_f * 1e3:4.1f}ms  {t_b * 1e3:4.1f}ms  {t_w * 1e3:4.1f}ms  "
                     f"{peaks[0] / 2**20:12.1f} / {peaks[1] / 2**20:.1f} MiB ({peaks[1] / max(peaks[0], 1):.2f} x)")
    lines.append("  bubble: the idle share of the step, measured; theory: (p-1)/(m+p-1) for 1F1B, "
                 "(p-1)(T_F+T_B-T_W) / step for ZB-H1 with the T's of your own boxes")
    if (os.cpu_count() or 1) < p:
        lines.append(f"  note: {p} ranks share {os.cpu_count()} cores here: compute boxes stretch, and the measured "
                     f"bubbles mean less")
    if not rows:
        lines.append(f"  no pair of runs finished, so there is nothing to compare:\n{summary(problems, 3)}")
    print("\n".join(lines), file=sys.stderr if not rows else sys.stdout)
    study = ZeroBubbleStudy(QID, run, problems, lines)
    study.rows = rows
    return study
