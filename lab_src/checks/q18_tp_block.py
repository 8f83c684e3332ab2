"""Visible check of q18 (tp_block), in one launch:

- the answer's tensor-parallel block on 2 ranks and on 4, in float64, against the unsharded block of the
  lab's model (topics/tensor_parallel/judge_block.py), dropout off and then on: the output, the input's gradient, every shard's
  gradients, the collectives of the forward and the backward, and the replicated LayerNorms after one AdamW
  step (identical on every rank); the block with dropout once more on two groups of 2 side by side (ranks
  [0, 2] and [1, 3]), where tp.rank is not the global rank, and in evaluation mode (nothing dropped);
- the digits model trained with it (topics/tensor_parallel/judge_train.py), t = 2 with dropout, and t = 2 x p = 2 on 4 ranks
  (tensor parallel inside pipeline stages), against one process's loss curve (q13's 1e-5 in float32); and a
  plain 2-stage pipeline of the same model, for the bytes: what one step moved, tensor parallel against
  pipeline, beside the answer's `predicted_bytes()`.

    report = check("q18")
    curves(report)             # the loss curves against one process's, and how far apart
    report.timeline()          # the 4-rank block run (or the first that failed): every collective, on a measured time axis
"""
from __future__ import annotations

from lab_src.checks.common import UNFINISHED, CheckReport, nothing_to_draw, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.checks.q17_tp_layers import TPReport
from lab_src.pipeline.config import LabConfig
from lab_src.topics.tensor_parallel.records import BLOCK_PARTS
from lab_src.topics.training.digits import DIGITS

CONFIGS = [(2, LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64")),
           (4, LabConfig(num_stages=4, global_batch_size=4, num_microbatches=2, dtype="float64", seed=5))]
# the dropout part on two groups of t = 2 side by side (ranks [0, 2] and [1, 3]): tp.rank is not the global rank there
GRID = "t = 2 x 2 groups"
STEPS, LR = 20, 1e-2
# label -> (configuration, t, ranks)
TRAINING = {"t = 2, dropout 0.1": (DIGITS.replace(num_stages=1, dropout=0.1, dropout_shards=2), 2, 2),
            "t = 2 x p = 2": (DIGITS.replace(num_stages=2), 2, 4),
            "p = 2 (no tensor parallelism)": (DIGITS.replace(num_stages=2), 1, 2)}


class BlockReport(TPReport):
    parts = BLOCK_PARTS

    training: list = []

    def curves(self):
        """Each training run's loss curve against one process's, and their relative difference per step."""
        return curves(self)


def curves(report):
    """The training runs of `report` (q18's check): each loss curve against one process's, and their relative
    difference per step. A report without them (autograding: the check launched nothing) draws nothing."""
    from lab_src.topics.tensor_parallel.curves import curves_figure
    if not getattr(report, "training", None):
        print(nothing_to_draw(report, "training") if getattr(report, "skipped", False) else
              "No training to draw: the check did not train (see its message above).")
        return None
    return curves_figure(report.training, "q18: the digits model, tensor parallel against one process")


def check() -> CheckReport:
    from lab_src.judge.problems import stamped
    from lab_src.topics.tensor_parallel.judge_layers import rounds_text
    from lab_src.topics.tensor_parallel.judge_block import WHAT, block_wrong, judge_part
    srcs = sources("q18")
    cases = [make_case("tp_block", cfg, srcs, "q18", stages=t, label=f"t = {t}") for t, cfg in CONFIGS]
    # the block's dropout on two tensor-parallel groups side by side, judged with the blocks above
    cases.append(make_case("tp_block", CONFIGS[0][1], srcs, "q18", stages=4, label=GRID,
                           settings={"parts": ["dropout"], "replicas": 2}))
    cases += [make_case("tp_train", cfg, srcs, "q18", stages=n, label=label, settings={"t": t, "steps": STEPS, "lr": LR})
              for label, (cfg, t, n) in TRAINING.items()]
    run = run_cases(cases, run_dir("q18"))
    problems, lines = [], ["q18 tp_block: the block on t ranks against the unsharded block (float64, to 1e-10)"]
    block_right = True      # the block without dropout, in every case: where not, the dropout's findings follow
    for (t, cfg), out in zip(CONFIGS, run.outcomes):
        label = f"t = {t}"
        lines.append(f"\n  {label}: {cfg.num_heads} heads, {cfg.num_heads // t} per rank")
        errs = errors(out, "q18", label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        for part in BLOCK_PARTS:
            found = judge_part(part, out)
            if part == "block":
                block_right = block_right and not block_wrong(found)
            problems += stamped(found["holds"] + found["numbers"] + found["replicated"] + found["communication"],
                                "q18", label)
            got = (out.obs.get(0, {}).get("tp_block") or {}).get(part) or {}
            verdict = "matches the unsharded block" if not (found["numbers"] or found["holds"]) else "see the problems"
            norms = "identical on every rank" if not found["replicated"] else "see the problems"
            lines.append(f"    {WHAT[part]}: {verdict}; LayerNorms after a step: {norms}")
            lines.append(f"      rank 0's forward: {rounds_text(got.get('fwd') or [])}")
            lines.append(f"      rank 0's backward: {rounds_text(got.get('bwd') or [])}")
        got = (out.obs.get(0, {}).get("tp_block") or {}).get("block") or {}
        if got.get("params") is not None:
            lines.append(f"      rank 0 holds qkv {tuple(got.get('qkv_weight_shape') or ())}, proj "
                         f"{tuple(got.get('proj_weight_shape') or ())}: {got['params']:,} parameter elements")
    grid = run.outcomes[len(CONFIGS)]
    lines.append(f"\n  {GRID}: the tensor-parallel groups are ranks [0, 2] and [1, 3] (tp.rank 0, 1 in each)")
    errs = errors(grid, "q18", GRID)
    if errs:
        problems += errs
        lines.append(UNFINISHED)
    else:
        found = judge_part("dropout", grid, block_right=block_right)
        problems += stamped(found["holds"] + found["numbers"] + found["replicated"] + found["communication"],
                            "q18", GRID)
        verdict = "matches the unsharded block" if not (found["numbers"] or found["holds"]) else "see the problems"
        lines.append(f"    {WHAT['dropout']}: {verdict}, in both groups")
    training, more = training_lines(run.outcomes[len(CONFIGS) + 1:], problems, block_right)
    lines += more
    from lab_src.topics.tensor_parallel.timeline import call_labels
    views = [{"events": o.events(recovered=True), "stages": o.case.stages, "microbatches": 1,
              "title": f"q18: {o.case.label}, every collective of each rank",
              "labels": call_labels(o, "tp_block", BLOCK_PARTS)} for o in run.outcomes[:len(CONFIGS)]]
    report = finish("q18", run, problems, lines, views=views, cls=BlockReport)
    report.training = training
    return report


def training_lines(outcomes, problems: list, block_right: bool = True) -> tuple[list, list[str]]:
    """Judge the training runs; the lines that say how far each curve is from one process's, and the bytes.
    `block_right`: whether the block without dropout was right (else a curve's departure follows from it)."""
    from lab_src.judge.problems import stamped
    from lab_src.topics.tensor_parallel.judge_train import curve_deviation, judge_training, single_process
    from lab_src.topics.tensor_parallel.traffic import measured_bytes
    lines = [f"\n  training the digits model, {STEPS} steps, against one process (relative, tolerance 1e-5):"]
    training, measured = [], {}
    for out in outcomes:
        label = out.case.label
        cfg, t = out.case.config, out.case.settings["t"]
        errs = errors(out, "q18", label)
        if errs:
            problems += errs
            lines.append(f"    {label}: {UNFINISHED}")
            continue
        found = judge_training(out, STEPS, LR, block_right=block_right)
        problems += stamped(found["curves"] + found["replicated"], "q18", label)
        want = single_process(cfg, STEPS, LR)
        curves = {r: o.get("losses") for r, o in sorted(out.obs.items()) if o.get("losses")}
        worst = max((curve_deviation(c, want) for c in curves.values()), default=float("inf"))
        lines.append(f"    {label}: the largest relative difference from one process over {STEPS} steps: {worst:.1e}")
        training.append({"label": label, "single": want, "curves": curves})
        got = measured_bytes(out.events(), STEPS, sum(o.get("sent_bytes", 0) for o in out.obs.values()))
        if t > 1 and out.case.stages == t:
            measured["tensor_parallel"] = got["tensor_parallel"]
        if t == 1:
            measured["pipeline"] = got["pipeline"]
    lines += bytes_lines(measured)
    return training, lines


def bytes_lines(measured: dict) -> list[str]:
    from lab_src.checks.common import sources as answer_files
    from lab_src.judge.numeric import NotANumber, read_numbers
    from lab_src.topics.tensor_parallel.traffic import PREDICTION_NAME
    path = answer_files("q18").get("q18")
    try:
        from pathlib import Path
        predicted = read_numbers(Path(path).read_text(), PREDICTION_NAME) if path else {}
    except (NotANumber, OSError) as e:
        predicted, why = {}, f" (your {PREDICTION_NAME}() could not be read: {e})"
    else:
        why = ""
    lines = [f"\n  bytes one training step moved (all ranks' all-reduce buffers and sends, as q14 counts){why}:"]
    for kind, run in (("tensor_parallel", "t = 2"), ("pipeline", "p = 2")):
        if kind in measured:
            guess = f"; you predicted {predicted[kind]:,.0f}" if kind in predicted else ""
            lines.append(f"    {kind} ({run}): {measured[kind]:,.0f}{guess}")
    if len(measured) == 2 and measured["pipeline"]:
        lines.append(f"    tensor parallel moves {measured['tensor_parallel'] / measured['pipeline']:.3g}x the pipeline's "
                     f"bytes for the same model and batch")
    return lines


__all__ = ["check", "curves"]
