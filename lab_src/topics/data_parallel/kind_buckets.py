"""Rank side of q20 (bucketed_step): the answer's Reducer and 1F1B step on a data x pipeline grid of all the case's
ranks, a few optimizer steps in a row, and what each step did.

The lab builds what q14's answer built (the layout global rank = dp_rank * pp_size + pp_rank, a group per
pipeline and per data-parallel set, each replica's stage from the same seed, its own shard of the data), so that
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

import datetime
import time

import torch
import torch.distributed as dist
from torch import nn

from lab_src import answers, exercises
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline import data
from lab_src.pipeline.stage import PipelineStage
from lab_src.topics.data_parallel.bucket_ring import LANE, DataParallel
from lab_src.topics.data_parallel.records import SEED_MLP
from lab_src.topics.tensor_parallel import rawcoll

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


def make_groups(lay_dp: int, lay_pp: int, rank: int, timeout_s: float, tied: bool = False):
    """Every rank creates every group, in the same order: the pipelines, the data-parallel sets, and with tied
    embeddings on more than one stage each replica's first and last stage."""
    timeout = datetime.timedelta(seconds=timeout_s)
    mine, made = {}, []
    for d in range(lay_dp):
        ranks = [d * lay_pp + p for p in range(lay_pp)]
        g = dist.new_group(ranks, timeout=timeout)
        made.append(g)
        if rank in ranks:
            mine["pipeline"] = (g, ranks)
    for p in range(lay_pp):
        ranks = [d * lay_pp + p for d in range(lay_dp)]
        g = dist.new_group(ranks, timeout=timeout)
        made.append(g)
        if rank in ranks:
            mine["dp"] = (g, ranks)
    if tied and lay_pp > 1:
        for d in range(lay_dp):
            ranks = [d * lay_pp, d * lay_pp + lay_pp - 1]
            g = dist.new_group(ranks, timeout=timeout)
            made.append(g)
            if rank in ranks:
                mine["tied"] = (g, ranks)
    return mine, made


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, settings = case.config, case.settings
    dp_size, pp = cfg.dp_size, cfg.num_stages
    dp_rank, pp_rank = divmod(ctx.rank, pp)
    m = cfg.num_microbatches
    mbs = cfg.global_batch_size // (dp_size * m)
    rawcoll.CASE_RANKS[:] = range(case.stages)
    data.SHARDS.clear()
    obs["grid"], obs["micro_batch_size"] = [dp_size, pp], mbs
    dpar = None
    mine = {}
    try:
        mine, _ = make_groups(dp_size, pp, ctx.rank, ctx.timeout_s, tied=cfg.tie_embeddings)
        pipe_group, _ = mine["pipeline"]
        dp_group, dp_ranks = mine["dp"]
        stage = PipelineStage(cfg, pp_rank, pp, mbs, ctx.device, pipe_group)
        observe.observe_stage(stage, obs)
        for name, p in stage.named_parameters():
            if name in settings.get("freeze", ()):
                p.requires_grad_(False)
        obs["params"] = params_of(stage)
        Reducer = reducer_class()
        tied = mine.get("tied") if stage.tied_embedding is not None else None
        if stage.tied_embedding is not None and tied is None:       # one stage: the weight is used twice, in one tensor
            tied = (None, [ctx.rank])
        dpar = DataParallel(dp_group, dp_ranks, ctx.rank, tied=tied)
        cap = settings["cap"]
        obs["cap"] = cap
        obs["mlp_plans"] = {}
        for mcap in settings.get("mlp_caps", ()):
            obs["mlp_plans"][str(mcap)] = plain_buckets(getattr(Reducer(seed_mlp(), dpar, mcap), "buckets", None))
        reducer = Reducer(stage, dpar, cap)
        obs["buckets"] = plain_buckets(getattr(reducer, "buckets", None))
        steps = obs["steps"] = []
        for k in range(settings.get("steps", 3)):
            observe.barrier(group)
            for p in stage.parameters():
                p.grad = None
            data_iter = iter(data.make_dataloader(cfg, mbs, dp_rank=dp_rank)) if stage.is_first_stage else None
            dpar.new_step()
            start, t0 = len(tracer.events), time.perf_counter()
            obs["stepping"] = k
            returned = exercises.bucketed_step(stage, data_iter, m, reducer)
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
        observe.finish_messages(stage, group, tracer)
        for g, _ in mine.values():      # every rank is past its steps: nothing is in flight on them
            dist.destroy_process_group(g)
    finally:
        if dpar is not None:
            dpar.close()
        rawcoll.CASE_RANKS.clear()
        obs["shards"] = [list(s) for s in data.SHARDS]
        observe.record_instrumentation(obs, tracer)
