"""Kind "baseline": the unsharded baseline step (q04), run on every rank."""
from __future__ import annotations

from lab_src.harness.case import Case
from lab_src.pipeline.baseline import compute_baseline


def run(case: Case, ctx, group, tracer, obs) -> None:
    obs.update(compute_baseline(case.config, ctx.device))
