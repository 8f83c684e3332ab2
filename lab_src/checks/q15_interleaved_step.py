"""Visible check of q15 (interleaved_step): the step on 4 ranks with 2 chunks each (8 blocks, 4
micro-batches) and on 2 ranks with 4 chunks each, compared with the unsharded baseline and judged
against Interleaved 1F1B (lab_src/topics/interleaved/judge.py); and `bubble_study()`, the same step for v = 1, 2
and 4 chunks per rank on a configuration where compute dominates: the measured bubble beside
(p-1)/(v·m+p-1), and what the chunks cost in messages and in activations held."""
from __future__ import annotations

import os
import sys

from lab_src.checks.common import (UNFINISHED, VISIBLE, CheckReport, autograding, exercise, failed_in_notebook, finish,
                                   indent, make_case, run_cases, run_dir, sources, study_sources)
from lab_src.checks.experiments import study_held_back
from lab_src.harness.memory_release import released
from lab_src.topics.interleaved.judge import check_interleaved_run, interleaved_errors
from lab_src.judge.problems import stamped
from lab_src.judge.summary import counts, summary
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.schedules import Interleaved1F1B
from lab_src.views import bubble, emulated, text_grid
from lab_src.views.saved import case_view
from lab_src.views.timeline import timelines

QID = "q15"
CHECKED = [(VISIBLE, 2), (VISIBLE.replace(num_stages=2), 4)]   # (configuration, chunks per rank)

# Compute dominates: 16 blocks of width 256 over 128 tokens, so that v = 4 still gives every virtual stage
# a whole block, and a block's forward takes milliseconds while a message takes a fraction of one.
STUDY = LabConfig(num_layers=16, hidden_size=256, num_heads=8, seq_len=128, vocab_size=512, global_batch_size=16,
                  num_microbatches=8, num_stages=4)


def _run(configs, folder, srcs):
    """Each (configuration, v) as an interleaved case, and the baselines computed from the student's q04."""
    from lab_src.harness.baselines import baselines_for
    baselines = baselines_for([cfg for cfg, _ in configs], srcs)
    cases = [make_case("interleaved", cfg, srcs, QID, schedule=Interleaved1F1B(v).name,
                       label=f"{cfg.describe()}, {v} chunks per rank") for cfg, v in configs]
    return run_cases(cases, folder, case_deadline_s=120, timeout_s=30), baselines


def compute_order(events, rank: int, limit: int = 16) -> str:
    """'F0c0 F1c0 F0c1 B0c1 ...': the first `limit` compute boxes of a rank, in the order they ran."""
    boxes = sorted((e for e in events if e.rank == rank and e.is_compute), key=lambda e: e.t_start)
    words = [f"{e.op.letter}{e.microbatch}c{e.chunk}" for e in boxes]
    return " ".join(words[:limit]) + (f" ... ({len(words)} in all)" if len(words) > limit else "")


def check() -> CheckReport:
    from lab_src.judge.compare import compare_run
    srcs = sources(QID)
    run, baselines = _run(CHECKED, run_dir(QID), srcs)
    problems, lines = [], [f"{QID} {exercise(QID).function}"]
    for (cfg, v), out in zip(CHECKED, run.outcomes):
        label = out.case.label
        lines.append(f"\n  {label}:")
        errs = stamped(interleaved_errors(out), QID, label)
        problems += errs
        if errs:
            lines.append(UNFINISHED)
            continue
        numbers = compare_run(out, baselines[cfg])
        found = stamped(check_interleaved_run(out) + numbers, QID, label)
        problems += found
        lines.append("    outputs, loss and every rank's gradients " +
                     ("DIFFER from the unsharded baseline (see below)" if numbers else "match the unsharded baseline")
                     + (", but see the problems below" if found and not numbers else ""))
        events = out.events()
        p = cfg.num_stages
        for r in range(p):
            chunks = out.obs[r].get("chunk_layers") or []
            held = (out.obs[r].get("memory") or {}).get("peak_held_chunks")
            lines.append(f"    rank {r}: chunks " + ", ".join(f"{c}={c * p + r} (blocks {ids})" for c, ids in enumerate(chunks))
                         + f"; at most {held} chunk forwards awaiting backward")
            lines.append(f"      {compute_order(events, r)}")
        lines.append(indent(text_grid.time_grid(events, p)))
        lines.append("    " + bubble.describe(events, p, cfg.num_microbatches, v))
    lines.append("\n  " + prediction_line(srcs[QID]))
    return finish(QID, run, problems, lines)


def prediction_line(path: str | None) -> str:
    """Whether the student's predicted_interleaving() matches the schedule's numbers (which entries differ,
    not the right values: the grader grades them)."""
    from pathlib import Path

    from lab_src.topics.interleaved.judge import (PREDICTION_MICROBATCHES, PREDICTION_NAME, PREDICTION_RANKS,
                                      prediction_problems)
    from lab_src.judge.numeric import NotANumber, read_numbers
    head = f"your prediction ({PREDICTION_NAME}, p = {PREDICTION_RANKS}, m = {PREDICTION_MICROBATCHES}): "
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME) if path else {}
    except NotANumber as e:
        return head + f"not read ({e}); it is graded"
    wrong = [p.message.split(";")[0].replace("the predicted ", "") for p in prediction_problems(got)]
    if not wrong:
        return head + "matches the schedule for v = 1, 2 and 4 (graded)"
    return head + "differs from the schedule: " + "; ".join(wrong) + " (graded; the bubble study measures them)"


class BubbleStudy(CheckReport):
    """The runs of `bubble_study`, one per v, with their figures (`timeline(i)`) and a table (`rows`)."""


@released
def bubble_study(chunks=(1, 2, 4), stages: int | None = None, cfg: LabConfig = STUDY) -> BubbleStudy | None:
    """Run your step with each number of chunks per rank in `chunks` on `cfg` (compute dominates) and print,
    for each, the measured bubble beside (p-1)/(v·m+p-1), the messages, and the activations held.
    `stages`: ranks (default 4, whatever the cores: the emulated column does not depend on them)."""
    if study_held_back(QID, "The bubble study", "open the notebook and run `study = bubble_study()` yourself",
                       "The bubble study runs your step"):
        return None
    stages = stages or 4
    cfg = cfg.replace(num_stages=stages, num_microbatches=2 * stages, global_batch_size=4 * stages)
    srcs = study_sources(QID)
    if srcs is None:
        return None
    # a first, unmeasured run: the launch's first step pays for allocations and connections
    configs = [(cfg.replace(num_microbatches=stages, global_batch_size=2 * stages), chunks[0])] + \
              [(cfg, v) for v in chunks]
    run, _ = _run(configs, run_dir(QID + "-bubble"), srcs)
    run.outcomes = run.outcomes[1:]
    p, m = stages, cfg.num_microbatches
    lines = [f"{QID} bubble study: {p} ranks, {cfg.num_layers} blocks of width {cfg.hidden_size}, {m} micro-batches "
             f"of {cfg.global_batch_size // m} x {cfg.seq_len} tokens",
             f"  {'v':>2}  {'step':>7}  {'emulated':>8}  {'ideal':>6}  {'theory':>6}  {'measured':>8}  {'messages':>8}  "
             f"{'MB sent':>7}  "
             f"{'held on rank 0 at the peak':>34}"]
    rows, problems, per_stage = [], [], None
    views = [case_view(out) for out in run.outcomes]
    for (_, v), out, view in zip(configs[1:], run.outcomes, views):
        errs = stamped(interleaved_errors(out), QID, out.case.label)
        if errs:
            problems += errs
            continue
        events = out.events()
        view["emulate"] = {}            # its second view: this run's order with emulated compute
        replayed = emulated.emulated_events(events, p, stage_layers=view["stage_layers"])
        _, ideal = timelines(events, p, m, schedule=view["schedule"], stage_layers=view["stage_layers"])
        span = max(e.t_end for e in events) - min(e.t_start for e in events)
        sends = [e for e in events if e.is_send]
        mem = out.obs[0].get("memory") or {}
        held, chunks_held = mem.get("peak_held_bytes") or 0, mem.get("peak_held_chunks") or 1
        # what one micro-batch's activations of a whole stage take: the yardstick of 1F1B, which holds p of them
        per_stage = per_stage or held / chunks_held * v
        compute = sum(e.t_end - e.t_start for e in events if e.is_compute)
        row = {"v": v, "step_s": span, "compute_s": compute, "bubble": bubble.measured_bubble(events, p), "ideal": ideal.bubble,
               "emulated": bubble.measured_bubble(replayed, p) if replayed else None,
               "theory": bubble.theoretical_bubble(p, m, v), "messages": len(sends),
               "bytes_sent": sum(e.bytes for e in sends), "held_chunks": chunks_held, "held_bytes": held,
               "held_vs_1f1b": held / (p * per_stage)}
        rows.append(row)
        memory = f"{chunks_held} chunk fwds, {held / 2**20:.0f} MB = {row['held_vs_1f1b']:.2f} x 1F1B"
        got = "n/a" if row["emulated"] is None else f"{row['emulated']:.1%}"
        lines.append(f"  {v:>2}  {span * 1e3:5.0f}ms  {got:>8}  {ideal.bubble:6.1%}  {row['theory']:6.1%}  "
                     f"{row['bubble']:8.1%}  {len(sends):>8}  {row['bytes_sent'] / 2**20:7.1f}  {memory:>34}")
    lines += ["  emulated compute: your run's own operations in its order, each box the median of its kind in this "
              "run, messages at the cost model's price, no CPU shared (views/emulated.py); ideal: the schedule's own "
              "order with the same costs; theory: (p-1)/(v·m+p-1); measured: the wall clock, the idle share of the step",
              f"  1F1B: what One-Forward-One-Backward holds, {p} micro-batches of a whole stage (from the first run)"]
    if (os.cpu_count() or 1) < p:
        lines.append(f"  note: {p} ranks share {os.cpu_count()} cores here, so compute boxes stretch and the "
                     f"measured bubble means less")
    if not rows:
        lines.append(f"  no run of your step finished, so there is nothing to compare:\n{summary(problems, 3)}")
    else:
        lines += [f"  {why}" for why in why_measured(rows, p, os.cpu_count() or 1)]
        lines.append("  " + prediction_line(srcs[QID]))
    print("\n".join(lines), file=sys.stderr if not rows else sys.stdout)
    study = BubbleStudy(QID, run, problems, lines, views=views)
    study.rows = rows
    return study.let_go()       # the views and rows stay; every rank's records go


def why_measured(rows: list[dict], p: int, cores: int) -> list[str]:
    """Why the measured bubble departs from the ideal, in this run's numbers: compute boxes stretched by
    ranks sharing cores (a rank waiting for a core looks busy, so the bubble looks smaller), and the
    messages, about v times as many with v chunks, each paid for on the ranks that wait for it."""
    said = []
    fastest = min(row["compute_s"] for row in rows)
    for row in rows:
        stretch = row["compute_s"] / fastest if fastest else 1.0
        if row["bubble"] < row["ideal"] - 0.01:
            said.append(f"v = {row['v']} measured {row['bubble']:.1%}, below its ideal {row['ideal']:.1%}: its compute "
                        f"boxes, summed over the ranks, took {row['compute_s'] * 1e3:.0f} ms"
                        + (f", {stretch:.2f} x the fastest run's" if stretch > 1.05 else "")
                        + (f"; {p} ranks share {cores} cores, and a rank waiting for a core counts as busy, so "
                           f"the idle share looks smaller than it is" if cores < p else
                           "; time a rank spends between boxes (Python, posting messages) counts as busy too"))
    base = next((row for row in rows if row["v"] == min(r["v"] for r in rows)), None)
    for row in rows:
        if base is None or row is base or row["bubble"] <= base["bubble"]:
            continue
        said.append(f"v = {row['v']} measured {row['bubble']:.1%}, worse than v = {base['v']}'s {base['bubble']:.1%} "
                    f"although its theory is {row['theory']:.1%} against {base['theory']:.1%}: it sent "
                    f"{row['messages']} messages against {base['messages']} ({row['bytes_sent'] / 2**20:.1f} MB "
                    f"against {base['bytes_sent'] / 2**20:.1f}), and each one costs time on the rank that waits for "
                    f"it; here that outweighs the shorter ramps"
                    + (f" (and {p} ranks share {cores} cores)" if cores < p else ""))
    return said


# ---- partition by tracing -------------------------------------------------------------------------------
class TracedPartition(CheckReport):
    """The report of `traced_partition`: an experiment, not graded, and its verdict says so."""
    TITLE = f"{QID} Part 2, the cut points in CUT_POINTS (an experiment: not graded)"

    def verdict(self) -> list[str]:
        first, *rest = super().verdict()
        if self.ok or self.skipped:
            return [self.TITLE + first[len(self.qid):]] + rest
        # not "FAILED" above a test cell that says Q15 passed: what differs, and that it costs no points
        causes, _ = counts(self.problems)
        return [f"{self.TITLE}: {causes} difference{'s' if causes != 1 else ''} from your Q5's stages (your Q15 "
                f"score does not depend on them)"] + rest


def traced_partition(cut_points: list[str], num_layers: int = 8) -> CheckReport | None:
    """Cut the lab's model at `cut_points` by tracing it (lab_src/topics/interleaved/traced.py) and compare the
    len(cut_points) + 1 stages with your Q5 partition of the same blocks: the pieces each stage holds, their
    parameters, and each stage's output on the same input. Returns the report, passed or failed (where they
    differ, or a cut point is not in the model); `report.raise_if_failed()` raises CheckFailed. Not graded."""
    import time

    import torch

    from lab_src import answers
    from lab_src.judge.problems import Problem
    from lab_src.judge.realness import expected_pieces
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import RAN, build_model
    from lab_src.pipeline.stage import PipelineStage
    from lab_src.topics.interleaved.traced import CutPointError, split_by_tracing
    if autograding():
        print("The traced partition is skipped while autograding.")
        return None
    srcs = answers.sources(["q03", "q05"])
    missing = [q for q, path in srcs.items() if path is None]
    if missing:
        return failed_in_notebook(QID, answers.StubCalled(answers.stub_message(missing[0], caller=QID)))
    p = len(cut_points) + 1
    cfg = LabConfig(num_layers=num_layers, num_stages=p)
    model = build_model(cfg)
    started = time.perf_counter()
    try:
        part = split_by_tracing(model, cut_points)
    except CutPointError as e:
        return finish(QID, None, [Problem(f"traced partition: {e}", exercise=QID, case="traced")], [],
                      cls=TracedPartition)
    traced_s = time.perf_counter() - started
    mbs = cfg.global_batch_size // cfg.num_microbatches
    tokens = next(iter(make_dataloader(cfg, mbs)))
    lines = [f"{QID} traced partition of {num_layers} blocks at {cut_points}: traced and split in "
             f"{traced_s * 1e3:.0f} ms, compared with your Q5 on {p} stages"]
    problems = []
    with answers.use_answers(srcs):
        hand = [PipelineStage(cfg, r, p, mbs) for r in range(p)]
    x_traced, x_hand = (tokens,), tokens
    crossing = part.crossing(tokens)
    for r in range(p):
        want = expected_pieces(hand[r].layer_ids, r, p)
        got = part.pieces(r)
        hand_names = sorted(n for n, _ in hand[r].named_parameters())
        line = f"  stage {r}: traced {', '.join(got)}"
        if got != want:
            problems.append(Problem(f"stage {r}: tracing put {', '.join(got)} on it; your Q5 gives it "
                                    f"{', '.join(want)}", exercise=QID, case="traced"))
        elif part.param_names(r) != hand_names:
            problems.append(Problem(f"stage {r}: the traced stage holds other parameters than the hand-built "
                                    f"one", exercise=QID, case="traced"))
        if r:
            line += f" · receives {len(crossing[r - 1])} tensor(s) {', '.join(map(str, crossing[r - 1]))}"
        with torch.no_grad():
            y_traced = part.stages[r](*x_traced)
            if len(x_traced) == 1 and got == want:
                y_hand = hand[r](x_hand, microbatch=0)
                try:
                    torch.testing.assert_close(y_traced, y_hand)
                    line += " · output equal to the hand-built stage's"
                except AssertionError as e:
                    problems.append(Problem(f"stage {r}: the traced stage's output differs from the hand-built "
                                            f"one: {e}", exercise=QID, case="traced"))
                x_hand = y_hand
        x_traced = y_traced if isinstance(y_traced, tuple) else (y_traced,)
        lines.append(line)
    RAN.clear()
    with torch.no_grad():
        part.split(tokens)
    lines.append(f"  the model counts each piece's forward calls in Python; running the traced stages counted "
                 f"{sum(RAN.values())} calls: code that is not a tensor operation ran once, while tracing, and is "
                 f"not in the graph")
    return finish(QID, None, problems, lines, cls=TracedPartition)


def what_crosses(cut_points: list[str], num_layers: int = 8) -> list[list[tuple]]:
    """Trace the lab's model, cut it at `cut_points` (any module, a block's parts included) and print what
    each stage holds and the shapes of the tensors that would travel across each cut."""
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    from lab_src.topics.interleaved.traced import split_by_tracing
    cfg = LabConfig(num_layers=num_layers)
    part = split_by_tracing(build_model(cfg), cut_points)
    crossing = part.crossing(next(iter(make_dataloader(cfg, cfg.global_batch_size // cfg.num_microbatches))))
    for r in range(len(part.stages)):
        print(f"stage {r}: {', '.join(part.pieces(r))}" + (f"; receives {', '.join(map(str, crossing[r - 1]))} "
                                                           f"as {part.inputs(r)}" if r else ""))
    return crossing
