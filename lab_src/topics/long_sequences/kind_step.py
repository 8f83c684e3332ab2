"""Rank side of q23's study in the pipeline (issue 56, part 4; checks/recompute_study.py): every block of this rank's
stage wrapped by the answer's `recompute_block(block, mode)` (the case's setting), then the case's pipelined step
(q12's one_f_one_b_step: the student's own in the notebook) on the stage, as the core's pipeline kind runs it.

Every event the tracer records carries the bytes autograd saved for backward that the rank holds when it ends
(harness/memory.py, whose hooks are the outermost): torch's non-reentrant checkpoint saves its inputs through them
and keeps what it will recompute out of them, so under "full" a block counts its input alone, as q23's closed form
says. (A module that keeps tensors on ctx without saving them would count less than it holds: q23's graded check
scans the live tensors; this study, not graded, reads the saved ones.) Recorded as the core's pipeline kind records:
outputs, loss, every gradient, the peak.
"""
from __future__ import annotations

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.memory import counting, peak_rss_bytes
from lab_src.harness.records import Memory
from lab_src.harness.settings import settings_of
from lab_src.pipeline import data


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        mode = settings_of(case).mode
        for key in list(stage.blocks.keys()):
            stage.blocks[key] = exercises.recompute_block(stage.blocks[key], mode)
        needs = exercises.needs_dataloader(ctx.rank, cfg.num_stages)
        loader = data.make_dataloader(cfg, obs["micro_batch_size"]) if needs else None
        observe.barrier(group)
        with counting(stage, tracer) as saved:
            returned = exercises.API[case.step](stage, iter(loader) if loader is not None else None,
                                                cfg.num_microbatches)
        obs["memory"] = Memory(peak_saved_bytes=saved.peak, peak_rss_bytes=peak_rss_bytes()).to_dict()
        observe.finish_messages(stage, group, tracer)
        obs["outputs"], obs["loss"] = observe.unpack_step(returned, obs)
        obs["grads"] = observe.gradients(stage)
    finally:
        observe.record_instrumentation(obs, tracer)
