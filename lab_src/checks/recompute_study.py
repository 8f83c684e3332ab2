"""q23's study in the pipeline (issue 56, part 4): your q12 1F1B step on 4 ranks, every block of each stage wrapped
by your recompute_block, once per mode (none, selective, full), in one launch. Per rank: the micro-batches it held
at once, the saved bytes it held at its peak (harness/memory.py's count, the memory lane's), and per micro-batch the
bytes against q23's closed form for its blocks (records.py kept_bytes, once a block); the rest of a micro-batch's bytes (the
embedding's on the first stage, the head's and the loss's on the last) is the same in every mode. And whether each
mode's gradients are the plain run's, bit for bit (dropout on, micro-batches in flight at once). Not graded:
Validate and the grader skip it.

    study = recompute_study()
    study.timeline(0)            # none; 1: selective, 2: full (each run's memory lane under its ranks)
    pipeline_kept_figure(study)  # per rank, the bytes a micro-batch keeps per mode, beside the closed form
"""
from __future__ import annotations

import sys

import torch

from lab_src.checks.common import CheckReport, make_case, run_cases, run_dir, study_sources
from lab_src.checks.experiments import study_held_back
from lab_src.harness.memory_release import released
from lab_src.judge.failures import case_problems
from lab_src.judge.problems import stamped
from lab_src.judge.summary import summary
from lab_src.pipeline.config import LabConfig
from lab_src.topics.long_sequences.records import MODES, kept_bytes
from lab_src.views.memory import holding, peak_by_rank
from lab_src.views.saved import case_view

QID, ONE_F_ONE_B = "q23", "q12"
# activations dominate: s = 128 tokens of width 64 in 4 heads, 2 blocks a stage, micro-batches of 2, dropout on
STUDY = LabConfig(num_layers=8, hidden_size=64, num_heads=4, seq_len=128, vocab_size=64, num_stages=4,
                  num_microbatches=8, global_batch_size=16, dropout=0.1, seed=35)
ITEMSIZE = 4        # float32, the lab's model


class RecomputeStudy(CheckReport):
    """The runs of `recompute_study` (`timeline(i)`: none, selective, full) and its `rows` (per rank and mode)."""
    rows: list = []


def _equal_to(grads: dict, plain: dict) -> bool:
    """Whether every gradient of a wrapped stage (its names carry the wrapper's attribute) is the plain stage's, bit
    for bit: matched by the block's index and the lab's own name of the parameter."""
    for name, want in plain.items():
        head, _, rest = name.partition(".")
        if head != "blocks":
            got = grads.get(name)
        else:
            index, _, leaf = rest.partition(".")
            got = next((g for n, g in grads.items() if n.startswith(f"blocks.{index}.") and n.endswith("." + leaf)),
                       None)
        if (got is None) != (want is None) or (want is not None and not torch.equal(got, want)):
            return False
    return True


@released
def recompute_study(stages: int = 4, microbatches: int = 8, cfg: LabConfig = STUDY) -> RecomputeStudy | None:
    """Run your q12 step on `stages` ranks with your q23 recompute_block wrapping every block, in each mode, and
    print what each rank held against q23's closed form."""
    if study_held_back(QID, "The recomputation study", "open the notebook and run `study = recompute_study()`",
                       "The study runs your recompute_block"):
        return None
    srcs = study_sources(ONE_F_ONE_B, QID)
    if srcs is None:
        return None
    c = cfg.replace(num_stages=stages, num_microbatches=microbatches, global_batch_size=2 * microbatches)
    cases = [make_case("recompute_step", c, srcs, QID, step=ONE_F_ONE_B, schedule="1f1b", settings={"mode": mode},
                       label=f"1F1B, recompute {mode}") for mode in MODES]
    run = run_cases(cases, run_dir(QID + "-study"), case_deadline_s=180, timeout_s=60)
    b, s, h, a = c.global_batch_size // microbatches, c.seq_len, c.hidden_size, c.num_heads
    lines = [f"{QID} in the pipeline: your 1F1B step on {stages} ranks, {c.num_layers} blocks (b = {b}, s = {s}, "
             f"h = {h}, a = {a}, float32, dropout {c.dropout}), m = {microbatches}; per rank, the saved bytes it held "
             f"at its peak and, per micro-batch, beside q23's closed form for its blocks"]
    problems, views, rows, peaks, plain = [], [], [], {}, None
    for out in run.outcomes:
        views.append(case_view(out))
        errs = stamped(case_problems(out), QID, out.case.label)
        if errs:
            problems += errs
            continue
        mode = out.case.settings["mode"]
        events = out.events()
        held = peak_by_rank(events, stages)
        count = peak_by_rank(holding([e for e in events if e.is_compute]), stages)
        grads = {r: (o.get("grads") or {}) for r, o in out.obs.items()}
        if mode == "none":
            plain = grads
        same = None if plain is None else all(_equal_to(grads[r], plain[r]) for r in plain)
        for r in range(stages):
            layers = len((out.obs.get(r) or {}).get("layers") or [])
            per = held[r] / count[r] if count[r] else 0
            form = layers * kept_bytes(b, s, h, a, ITEMSIZE, mode)     # each block its own input and mask
            rows.append({"mode": mode, "rank": r, "in_flight": count[r], "peak": held[r], "per_microbatch": per,
                         "formula": form, "rest": per - form, "layers": layers, "as_plain": same})
        peaks[mode] = held
    lines.append(f"  {'mode':>9} {'rank':>4} {'blocks':>6} {'in flight':>9} {'peak (B)':>12} {'per mb (B)':>11} "
                 f"{'closed form':>11} {'rest':>8} {'gradients':>9}")
    for row in rows:
        same = {True: "as plain", False: "DIFFER", None: "-"}[row["as_plain"]]
        lines.append(f"  {row['mode']:>9} {row['rank']:>4} {row['layers']:>6} {row['in_flight']:>9} "
                     f"{row['peak']:>12,} {row['per_microbatch']:>11,.0f} {row['formula']:>11,} "
                     f"{row['rest']:>8,.0f} {same:>9}")
    if rows:
        lines += [
            "  in flight: the most micro-batches the rank held awaiting their backward (1F1B: min(p - r, m));",
            "  per mb: the peak over them; closed form: q23's for each of its blocks (each block's input and causal "
            "mask among them);",
            "  rest: what the stage's other pieces keep (the embedding's on rank 0, the head's and the loss's on the "
            "last), the same in every mode.",
            "  Not counted: the activations a recomputing block makes again inside its own backward (alive only "
            "there, one block at a time): torch's checkpoint keeps them out of the lab's count"]
    else:
        lines.append(f"  no run finished, so there is nothing to compare:\n{summary(problems, 3)}")
    print("\n".join(lines), file=sys.stderr if not rows else sys.stdout)
    study = RecomputeStudy(QID, run, problems, lines, views=views)
    study.rows = rows
    return study.let_go()


def pipeline_kept_figure(study):
    """Per rank, the bytes a micro-batch kept per mode (the run's) beside the closed form."""
    from lab_src.topics.long_sequences.figure import pipeline_bars
    rows = getattr(study, "rows", None)
    if not rows:
        print("Nothing to draw: run `study = recompute_study()` first (it runs only when you run the notebook).")
        return None
    return pipeline_bars(rows)


__all__ = ["pipeline_kept_figure", "recompute_study"]
