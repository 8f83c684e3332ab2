"""Rank side of the network study (q19's notebook): the answer's ring all-reduces the seed's four layers' gradients,
last layer first as a backward finishes them, step after step, over an emulated network (network.py) with a
latency tail.

Every send of the answer goes through the rank's emulated links (comm/messages.py `NETWORK`), which hold it
back for its delay without using the CPU. Each step starts at a barrier of the case's ranks; the rank times each
layer's all-reduce and the step, and keeps every message it sent with its delay and whether it was slow. The
study (tail.py) takes each step's and each layer's slowest rank, and marks the slow messages.
"""
from __future__ import annotations

import time

from lab_src import exercises
from lab_src.comm import messages as msgs
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.topics.data_parallel.inputs import tensor_of
from lab_src.topics.data_parallel.network import Links, Network


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    s = settings_of(case)
    layers = s.layers                       # [[name, length]] in the order a backward finishes them
    links = Links(Network(**s.network), ctx.rank, msgs._ORIGINAL["isend"])
    obs["group"] = list(range(case.stages))
    steps = obs["steps"] = []                  # per step: [seconds of each layer's all-reduce], then the step's
    marks = obs["marks"] = []                  # per step: the number of the rank's events before it
    grads = [tensor_of(cfg.seed, length, ctx.rank, cfg.dtype) for _, length in layers]
    msgs.NETWORK[0] = links
    try:
        for step in range(s.steps):
            observe.barrier(group)
            marks.append(len(tracer.events))
            times, start = [], time.perf_counter()
            for i, g in enumerate(grads):
                links.tag = [step, i]
                y = g.clone()
                t0 = time.perf_counter()
                exercises.ring_all_reduce(y, group)
                times.append(time.perf_counter() - t0)
            steps.append(times + [time.perf_counter() - start])
        observe.finish_messages(None, group, tracer)
    finally:
        msgs.NETWORK[0] = None
        links.close()
        obs["sent"] = links.sent
        observe.record_instrumentation(obs, tracer)
