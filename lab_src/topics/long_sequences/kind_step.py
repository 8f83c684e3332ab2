"""Rank side of q23's study in the pipeline (issue 56, part 4; checks/recompute_study.py): every block of this rank's
stage wrapped by the answer's `recompute_block(block, mode)` (the case's setting), then the case's pipelined step
(q12's one_f_one_b_step: the student's own in the notebook) run and recorded as the core's pipeline kind runs it
(harness/kinds/pipeline.py `run_step`).

Every event the tracer records carries the bytes autograd saved for backward that the rank holds when it ends
(harness/memory.py, whose hooks are the outermost): torch's non-reentrant checkpoint saves its inputs through them
and keeps what it will recompute out of them, so under "full" a block counts its input alone, as q23's closed form
says. (A module that keeps tensors on ctx without saving them would count less than it holds: q23's graded check
scans the live tensors; this study, not graded, reads the saved ones.)
"""
from __future__ import annotations

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.kinds.pipeline import run_step
from lab_src.harness.settings import settings_of


def run(case: Case, ctx, group, tracer, obs) -> None:
    try:
        stage = observe.build_stage(case.config, ctx, group, obs)
        mode = settings_of(case).mode
        for key in list(stage.blocks.keys()):
            stage.blocks[key] = exercises.recompute_block(stage.blocks[key], mode)
        run_step(case, ctx, group, tracer, obs, stage)
    finally:
        observe.record_instrumentation(obs, tracer)
