"""Visible check of q17 (tp_layers): the answer's tensor-parallel pieces on 2 ranks and on 4, in float64,
against the unsharded layers and MLP of the lab's block (topics/tensor_parallel/judge_layers.py): the two communication functions,
the column- and row-parallel layers, then the MLP. For each it prints the collectives every rank's forward
and backward made (read from the event record: the answer's own torch.distributed calls), and what each
rank holds.

    report = check("q17")
    report.timeline()          # the 4-rank run (or the first that failed): every collective, on a measured time axis
"""
from __future__ import annotations

from lab_src.checks.common import UNFINISHED, CheckReport, nothing_to_draw, errors, finish, indent, make_case, run_cases, run_dir, sources
from lab_src.pipeline.config import LabConfig
from lab_src.topics.tensor_parallel.records import LAYER_PARTS

CONFIGS = [(2, LabConfig(num_stages=2, global_batch_size=4, num_microbatches=2, dtype="float64")),
           (4, LabConfig(num_stages=4, global_batch_size=4, num_microbatches=2, dtype="float64", seed=5))]


class TPReport(CheckReport):
    """A check report whose timeline draws the tensor-parallel ranks' collectives (topics/tensor_parallel/timeline.py)."""

    parts = LAYER_PARTS      # the parts of each case, in the order they ran (q18's report names its own)

    def timeline(self, case: int | None = None):
        """One case's run (by default the first that failed, else the last, 4 ranks): every rank's collectives."""
        if not self.views:
            print(nothing_to_draw(self))
            return None
        from lab_src.topics.tensor_parallel.timeline import show_tp_timeline
        failed = self.failed_case()
        v = self.views[case if case is not None else (failed if not self.ok else len(self.views) - 1)]
        return show_tp_timeline(v["events"], v["stages"], v["title"], self.parts, v.get("labels"))


def check() -> CheckReport:
    from lab_src.judge.problems import stamped
    from lab_src.topics.tensor_parallel.judge_layers import WHAT, causes_first, judge_part
    from lab_src.topics.tensor_parallel.timeline import call_labels
    srcs = sources("q17")
    cases = [make_case("tp", cfg, srcs, "q17", stages=t, label=f"t = {t}") for t, cfg in CONFIGS]
    run = run_cases(cases, run_dir("q17"))
    problems, lines = [], ["q17 tp_layers: each piece on t ranks against the unsharded layer (float64, to 1e-10)"]
    for (t, cfg), out in zip(CONFIGS, run.outcomes):
        label = f"t = {t}"
        lines.append(f"\n  {label}: input {tuple(_shape(cfg))}, {cfg.dtype}")
        errs = errors(out, "q17", label)
        if errs:
            problems += errs
            lines.append(UNFINISHED)
            continue
        judged = causes_first({part: judge_part(part, out) for part in LAYER_PARTS})
        for part in LAYER_PARTS:
            found = judged[part]
            mine = stamped(found["holds"] + found["numbers"] + found["communication"], "q17", label)
            problems += mine
            got = (out.obs.get(0, {}).get("tp") or {}).get(part) or {}
            verdict = "matches the unsharded layer" if not (found["numbers"] or found["holds"]) else "see the problems"
            lines.append(f"    {WHAT[part]}: {verdict}; rank 0's forward: {_rounds(got.get('fwd'))}; "
                         f"backward: {_rounds(got.get('bwd'))}")
        lines.append(indent(held_table(out), "      "))
    views = [{"events": o.events(recovered=True), "stages": o.case.stages, "microbatches": 1,
              "title": f"q17: {o.case.label}, every collective of each rank",
              "labels": call_labels(o, "tp", LAYER_PARTS)} for o in run.outcomes]
    return finish("q17", run, problems, lines, views=views, cls=TPReport)


def _shape(cfg):
    from lab_src.topics.tensor_parallel.runtime import batch_shape
    return batch_shape(cfg)


def _rounds(rounds) -> str:
    from lab_src.topics.tensor_parallel.judge_layers import rounds_text
    return rounds_text(rounds or [])


def held_table(outcome) -> str:
    """What each rank's MLP holds: the shapes of its two weight shards, and its parameter elements."""
    rows = []
    for r, o in sorted(outcome.obs.items()):
        got = (o.get("tp") or {}).get("mlp") or {}
        if got.get("params") is not None:
            rows.append(f"rank {r} holds up.weight {tuple(got.get('up_weight_shape') or ())}, down.weight "
                        f"{tuple(got.get('down_weight_shape') or ())}: {got['params']:,} parameter elements")
    return "\n".join(rows)


__all__ = ["check", "TPReport"]
