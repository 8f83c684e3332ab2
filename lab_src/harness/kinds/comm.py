"""Kind "comm" (q07): every rank calls the four point-to-point operations in the order of the case's
schedule, with the no-ops at the ends, no compute. Each send carries a tensor whose values say who sent it
and for which micro-batch (`observe.label_tensor`); each receive records what arrived."""
from __future__ import annotations

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.kinds.probes import noop_ends
from lab_src.pipeline.schedules import schedule


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        obs["probes"] = {"noop_ends": noop_ends(stage)}
        observe.barrier(group)
        calls = []
        for step in schedule(case.schedule).messages(ctx.rank, cfg.num_stages, cfg.num_microbatches):
            op, mb = step.op.value, step.microbatch
            tensor = observe.label_tensor(stage, ctx.rank, mb, step.op.phase) if step.op.is_send else None
            before = len(tracer.events)
            got = exercises.pipeline_communicate(op, stage, tensor=tensor, microbatch=mb)
            # the micro-batch each message this call sent or received was recorded with
            traced = [e.microbatch for e in tracer.events[before:]]
            calls.append([op, mb, observe.read_label(got), traced])
        obs["calls"] = calls
        observe.finish_messages(stage, group, tracer)
    finally:
        observe.record_instrumentation(obs, tracer)
