"""Rank side of q20 (bucketed_step): the answer's Reducer and 1F1B step on a data x pipeline grid of all the case's
ranks, a few optimizer steps in a row, and what each step did.

The lab builds what q14's answer built (comm/grid.py: the layout global rank = dp_rank * pp_size + pp_rank, a group
per pipeline and per data-parallel set, each replica's stage from the same seed, its own shard of the data), so that
only the reduction is the answer's: the answer cell's `Reducer(stage, dp, cap_bytes)` is built once, with a
`DataParallel` (bucket_ring.py) whose launches run the answer's (in grading, the reference's) q19 ring in lane 1
of the rank. Then, `steps` times: zero the gradients, `bucketed_step(stage, data_iter, m, reducer)`, wait for any
ring still running, record, and take one SGD step, so that the next step's gradients differ.

Recorded per rank: the stage's parameters (name, bytes, requires_grad) and the Reducer's `buckets`, the plans the
answer's Reducer makes for the seed's MLP under `mlp_caps`, and per step the gradients, the loss, every launch
(time, bytes), the stage's backwards (micro-batch, start, end) and the messages of the reducing lane. Plain
values, never a verdict: judge_buckets.py decides.
"""
from __future__ import annotations

import time

import torch
from torch import nn

from lab_src import answers, exercises
from lab_src.comm.grid import grid_case
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.topics.data_parallel.bucket_ring import LANE, DataParallel
from lab_src.topics.data_parallel.records import SEED_MLP

FUNCTION = "bucketed_step"
SGD_LR = 0.1


def reducer_class():
    """The answer cell's `Reducer` (the student's, or in the grader the reference's)."""
    qid = exercises.bucketed_step.exercise.id
    step = answers.load(qid)
    if step is None:
        raise answers.StubCalled(answers.stub_message(qid))
    found = getattr(step, "__globals__", {}).get("Reducer")
    if not isinstance(found, type):
        raise answers.AnswerError(f"{qid}: your answer cell must define a class Reducer(stage, dp, cap_bytes) beside "
                                  f"{FUNCTION} (see the contract of {FUNCTION})")
    return found


def seed_mlp() -> nn.Module:
    """The seed's MNIST MLP, 784-256-128-64-10: only its parameters' names and sizes matter (for a plan)."""
    mlp = nn.Module()
    for i in range(len(SEED_MLP) - 1):
        setattr(mlp, f"fc{i + 1}", nn.Linear(SEED_MLP[i], SEED_MLP[i + 1]))
    return mlp


def params_of(module) -> list:
    return [[n, p.numel() * p.element_size(), bool(p.requires_grad)] for n, p in module.named_parameters()]


def plain_buckets(buckets):
    try:
        return [[str(n) for n in b] for b in buckets]
    except TypeError:
        return repr(buckets)[:300]


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    dpar = None
    with grid_case(case, ctx, group, tracer, obs, tied=case.config.tie_embeddings, record_shards=True) as grid:
        try:
            stage = grid.stage()
            for name, p in stage.named_parameters():
                if name in settings.freeze:
                    p.requires_grad_(False)
            obs["params"] = params_of(stage)
            Reducer = reducer_class()
            tied = grid.tied if stage.tied_embedding is not None else None
            if stage.tied_embedding is not None and tied is None:   # one stage: the weight is used twice, in one tensor
                tied = (None, [ctx.rank])
            dpar = DataParallel(grid.dp_group, grid.dp_ranks, ctx.rank, tied=tied)
            cap = settings.cap
            obs["mlp_plans"] = {}
            for mcap in settings.mlp_caps:
                obs["mlp_plans"][str(mcap)] = plain_buckets(getattr(Reducer(seed_mlp(), dpar, mcap), "buckets", None))
            reducer = Reducer(stage, dpar, cap)
            obs["buckets"] = plain_buckets(getattr(reducer, "buckets", None))
            steps = obs["steps"] = []
            for k in range(settings.steps):
                observe.barrier(group)
                for p in stage.parameters():
                    p.grad = None
                data_iter = grid.data_iter(stage)
                dpar.new_step()
                start, t0 = len(tracer.events), time.perf_counter()
                obs["stepping"] = k
                returned = exercises.bucketed_step(stage, data_iter, grid.m, reducer)
                t1 = time.perf_counter()
                dpar.drain()
                outputs, loss = observe.unpack_step(returned, obs)
                events = tracer.events[start:]
                steps.append({
                    "span": [t0, t1],
                    "loss": loss,
                    "launches": [list(x) for x in dpar.launches],
                    "backwards": [[e.microbatch, e.t_start, e.t_end] for e in events
                                  if e.kind == "backward" and not e.lane],
                    "ring_sends": [[e.peer, e.bytes, e.t_start] for e in events if e.lane == LANE and e.is_send],
                    "collectives": [e.kind for e in events if e.is_collective and e.kind != "allreduce_tied"],
                    "tied_sums": [list(x) for x in dpar.tied_sums],
                    "grads": observe.gradients(stage),
                })
                with torch.no_grad():
                    for p in stage.parameters():
                        if p.grad is not None:
                            p -= SGD_LR * p.grad
            obs.pop("stepping", None)
            grid.finish(stage)      # every rank is past its steps: nothing is in flight on the groups
        finally:
            if dpar is not None:
                dpar.close()
