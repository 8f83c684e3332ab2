"""Visible check of q27 (load_sharded, with save_sharded): q21's sharded AdamW state of the lab's model after two of
q21's steps (the answer's own q21), saved on 4 ranks and loaded on 3 (105,718 parameters, float32), then saved on 2
and loaded on 3 (28,714, float64), judged by topics/checkpoint/judge.py: the folder's bytes against the state's, each
loading rank's reads against its slices, the loaded state against the saved one bitwise, and the next step against
the step from the state handed over in memory. It prints per rank the bytes written and read beside the shard's and
the slices', and the prediction beside its figures.

    report = check("q27")
    reads_figure(report)       # the first case: the old shards, the new, and what each new rank read
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import (
    UNFINISHED,
    CheckReport,
    errors,
    finish,
    make_case,
    nothing_to_draw,
    run_cases,
    run_dir,
    sources,
)
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.checkpoint.records import (
    PREDICTION_KEYS,
    PREDICTION_NAME,
    PREDICTION_SHAPE,
    shard_bounds,
    slice_bytes,
    state_bytes,
)

CASES = [("saved on 4, loaded on 3 (105,718 parameters, float32)", 4, 3,
          LabConfig(num_stages=1, num_layers=8, vocab_size=54, global_batch_size=12, seed=61)),
         ("saved on 2, loaded on 3 (28,714 parameters, float64)", 2, 3,
          LabConfig(num_stages=1, num_layers=2, vocab_size=42, global_batch_size=12, dtype="float64", seed=62))]


class CheckpointReport(CheckReport):
    """A check report that also holds what the first case's loading ranks read (for reads_figure)."""
    drawn: dict | None = None


def reads_figure(report):
    """The first case: the old shards, the new ones, and the bytes each new rank's process read (a report skipped
    while autograding, or stopped before launching, draws nothing and says why)."""
    from lab_src.topics.checkpoint.figure import reshard_figure
    drawn = getattr(report, "drawn", None)
    if not drawn:
        print(nothing_to_draw(report))
        return None
    return reshard_figure(**drawn)


def check():
    from lab_src.topics.checkpoint.judge import PARTS, WHAT, io_count, judge_run
    srcs = sources("q27")
    cases = [make_case("checkpoint", cfg, srcs, "q27", stages=max(n, m), label=label,
                       settings={"save": n, "load": m}, schedule="", step="")
             for label, n, m, cfg in CASES]
    run = run_cases(cases, run_dir("q27"))
    problems, lines = [], ["q27 save_sharded and load_sharded: two of q21's steps, a save on n ranks, a load on m"]
    drawn = None
    for i, out in enumerate(run.outcomes):
        lines.append(f"\n  {out.case.label}")
        errs = errors(out, "q27", out.case.label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        found = judge_run(out)
        problems += [p for part in PARTS for p in stamped(found[part], "q27", out.case.label)]
        lines.append(table(out, found, PARTS, WHAT))
        if i == 0:
            o0 = out.obs[0]
            drawn = {"total": o0["elements"], "old": CASES[0][1], "new": CASES[0][2], "element": o0["element_size"],
                     "reads": {r: c for r in out.obs if (c := io_count(out, r, "load")[0]) is not None},
                     "title": f"your run: {out.case.label}: the old shards (files), the new shards, and what each new "
                              f"rank's process read"}
    lines.append(prediction(srcs.get("q27")))
    report = finish("q27", run, problems, lines, cls=CheckpointReport)
    report.drawn = drawn
    return report


def table(out, found, parts, what) -> str:
    from lab_src.harness.settings import settings_of
    from lab_src.topics.checkpoint.judge import io_count, measure_folder
    s = settings_of(out.case)
    o0 = out.obs[0]
    total, e = o0["elements"], o0["element_size"]
    files, who = measure_folder(out)
    rows = [f"    N = {total:,} elements of {e} B; the state is {state_bytes(total, e):,} B; on disk "
            f"{sum(files.values()):,} B in {len(files)} files ({who})",
            f"    {'rank':>4} {'wrote (B)':>11} {'its shard (B)':>13} {'read (B)':>11} {'its slices (B)':>14}"]
    for r in range(max(s.save, s.load)):
        a, b = shard_bounds(total, s.save, r) if r < s.save else (0, 0)
        written = io_count(out, r, "save")[0] if r < s.save else None     # counted from outside the rank where
        reads = io_count(out, r, "load")[0] if r < s.load else None       # the watch ran: what the judge takes
        wrote = f"{written:,}" if written is not None else "-"
        shard = f"{3 * (b - a) * e:,}" if r < s.save else "-"
        read = f"{reads:,}" if reads is not None else "-"
        need = f"{slice_bytes(total, s.load, r, e):,}" if r < s.load else "-"
        rows.append(f"    {r:>4} {wrote:>11} {shard:>13} {read:>11} {need:>14}")
    for part in parts:
        rows.append(f"    {what[part]}: {'right' if not found[part] else 'wrong (above)'}")
    return "\n".join(rows)


def prediction(path: str | None) -> str:
    from lab_src.judge.numeric import TOLERANCE, NotANumber, read_numbers, verdict_lines
    from lab_src.topics.checkpoint.records import prediction_wanted
    p = PREDICTION_SHAPE
    head = (f"\n  your prediction, {PREDICTION_NAME}(), graded (right within {TOLERANCE:.1%}):\n"
            f"    N = {p['total']:,} float32 elements, saved on {p['old']} ranks, loaded on {p['new']}: new rank "
            f"{p['rank']}'s bytes of slices, old files opened, and those files' bytes whole")
    try:
        got = read_numbers(Path(path).read_text(errors="replace"), PREDICTION_NAME, PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        return head + f"\n    could not be read: {e}"
    return "\n".join([head] + verdict_lines(got, prediction_wanted(), "it is"))


__all__ = ["check", "reads_figure"]
