"""Kind "pipeline": the step function the case names (q08's afab_step, ...) on every rank's stage, with
what the comparisons need (outputs, loss, gradients) and, as the case's probes ask, q07's no-ops at the
ends and q09's and q10's checks (kinds/probes.py).

On a case whose settings say "perturb", rank 0 changes its stage's embedding right after building it
(pipeline/perturb.py): the judge then expects the outputs of the changed model.

Every event carries the activation memory the step holds (harness/memory.py), and obs["memory"] has the
peak beside the process's peak resident set size so far (meaningful for the first or largest case of a
launch).
"""
from __future__ import annotations

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.kinds import probes as probe
from lab_src.harness.memory import counting, peak_rss_bytes
from lab_src.harness.records import Memory
from lab_src.harness.settings import settings_of
from lab_src.pipeline import data, perturb, split
from lab_src.pipeline.baseline import load_baseline


def run_step(case: Case, ctx, group, tracer, obs, stage):
    """The case's step on `stage` (built, and changed as the kind needs): its data where q06's answer says, the
    saved bytes counted on every event, then outputs, loss, gradients and the peak recorded. Returns what the step
    returned. Topics whose kinds change the stage first (q23's study, topics/long_sequences/kind_step.py) call it."""
    cfg = case.config
    needs = exercises.needs_dataloader(ctx.rank, cfg.num_stages)
    obs["needs_dataloader"] = observe.plain(needs)
    loader = data.make_dataloader(cfg, obs["micro_batch_size"]) if needs else None
    if case.step == split.exercise_id():
        split.warm_up()     # outside the traced step: torch's first autograd.grad imports sympy
    observe.barrier(group)
    step = exercises.API[case.step]
    with counting(stage, tracer) as saved:
        returned = step(stage, iter(loader) if loader is not None else None, cfg.num_microbatches)
    obs["memory"] = Memory(peak_saved_bytes=saved.peak, peak_rss_bytes=peak_rss_bytes()).to_dict()
    observe.finish_messages(stage, group, tracer)
    obs["outputs"], obs["loss"] = observe.unpack_step(returned, obs)
    obs["grads"] = observe.gradients(stage)
    return returned


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    probes = case.probes
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        if settings_of(case).perturb and stage.embed is not None:
            # evidence from outside the answer: the outputs must follow a change only rank 0 knows
            obs["perturbed"] = perturb.new_seed()
            perturb.perturb_embedding(stage.embed, obs["perturbed"])
        if "noop_ends" in probes:
            obs["probes"] = {"noop_ends": probe.noop_ends(stage)}
        returned = run_step(case, ctx, group, tracer, obs, stage)
        if case.baseline and ("check_outputs" in probes or "check_gradients" in probes):
            baseline = load_baseline(case.baseline)
            obs.setdefault("probes", {})
            if "check_outputs" in probes:
                obs["probes"]["check_outputs"] = probe.check_outputs(stage, returned[0], baseline)
            if "check_gradients" in probes:
                obs["probes"]["check_gradients"] = probe.check_gradients(stage, baseline)
    finally:
        observe.record_instrumentation(obs, tracer)
