"""Visible check of q07 (pipeline_communicate): every rank calls the four operations in the order of the
All-Forward-All-Backward schedule, sending tensors labelled with sender and micro-batch."""
from __future__ import annotations

from lab_src.checks.common import (UNFINISHED, CaseOutcome, CheckReport, VISIBLE, errors, finish, indent, make_case,
                                   run_cases, run_dir, sources)
from lab_src.judge.probes import judge_comm
from lab_src.judge.problems import stamped
from lab_src.views import text_grid


def check() -> CheckReport:
    srcs = sources("q07")
    configs = [VISIBLE.replace(num_microbatches=2, global_batch_size=4), VISIBLE.replace(num_stages=2, num_layers=4)]
    problems, lines = [], ["q07 pipeline_communicate: every rank calls the four operations in "
                           "All-Forward-All-Backward order, sending tensors labelled with sender and micro-batch"]
    run = run_cases([make_case("comm", cfg, srcs, "q07") for cfg in configs], run_dir("q07"))
    for cfg, out in zip(configs, run.outcomes):
        label = f"{cfg.num_stages} stages, {cfg.num_microbatches} micro-batches"
        lines.append(f"\n  {label}:")
        errs = errors(out, "q07", label)
        problems += errs + stamped(judge_comm(out), "q07", label)
        if errs:
            lines.append(UNFINISHED)
        elif not out.errors() and not out.failure:
            lines.append(indent(text_grid.step_grid(out.events(), cfg.num_stages) if any(
                e.is_compute for e in out.events()) else _message_table(out)))
    return finish("q07", run, problems, lines)


def _message_table(out: CaseOutcome) -> str:
    rows = []
    for r in sorted(out.obs):
        ops = [e.label() for e in out.events() if e.rank == r]
        rows.append(f"rank {r}: " + ("; ".join(ops) if ops else "(no messages)"))
    return "\n".join(rows)
