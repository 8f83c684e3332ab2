"""Rank side of the ring study (q19's notebook, benchmarks/ring_all_reduce.py): the answer's ring and gloo's own
all-reduce, each timed on the case's ranks at lengths from one element to millions, `repeats` times each.

Each timed call starts after a barrier of the case's ranks and is timed on every rank; the study (study.py)
takes, per call, the slowest rank's time, as nccl-tests does. The ring's messages are recorded as in every
case (the lab's point-to-point layer), so its time is the student path's, recording included; gloo's
all-reduce goes through the lab's collective recorder (comm/collectives.py) the same way.
"""
from __future__ import annotations

import time

import torch.distributed as dist

from lab_src import exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.topics.data_parallel.inputs import tensor_of


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    repeats = settings_of(case).repeats
    timings = obs["timings"] = {"ring": {}, "gloo": {}}
    obs["group"] = list(range(case.stages))
    try:
        for length in settings_of(case).lengths:
            x = tensor_of(cfg.seed, length, ctx.rank, cfg.dtype)
            for name in ("ring", "gloo"):
                times = timings[name][length] = []
                for _ in range(repeats):
                    y = x.clone()
                    observe.barrier(group)
                    t0 = time.perf_counter()
                    if name == "ring":
                        exercises.ring_all_reduce(y, group)
                    else:
                        dist.all_reduce(y, group=group)
                    times.append(time.perf_counter() - t0)
                    del tracer.events[:]     # the study keeps times, not every message of every repeat
        observe.finish_messages(None, group, tracer)
    finally:
        observe.record_instrumentation(obs, tracer)
