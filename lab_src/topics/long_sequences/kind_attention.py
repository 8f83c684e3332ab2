"""Kind "attention" (q24): the answer's `ring_attention` and, beside it in the same answer cell, `ulysses_attention`,
on the case's ranks, one run of the settings after another (records.py `AttentionSettings`).

For each run every rank draws the run's whole q, k, v and output gradient from the case's seed (attention.py
`tensors`; in a hidden case changed by noise from a seed rank 0 draws outside the answer and shares through the
launch's store), pads them at the end to the layout's multiple, takes its own rows (`shard`), and calls the answer on
them, then `backward` with its rows of the output's gradient. It records, never judging:

    out, dq, dk, dv     its rows of the output and of the three gradients
    forward, backward   the messages it made in each (peer's global rank, bytes, posted, done), its collectives
                        (kind, bytes), and every matmul it ran (start, end, FLOPs: attention.py `Work`, a dispatch
                        mode of the lab's around the call)

A run that raises is recorded and the next one runs, after a barrier of the case's ranks (a run that raised on some
ranks only leaves the others waiting in a message: the deadlock watch ends the case and says who waited for what).
"""
from __future__ import annotations

import time
import traceback

import torch
import torch.distributed as dist

from lab_src import answers, exercises
from lab_src.comm import collectives as coll
from lab_src.harness import case_barrier, observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import perturb, waiting
from lab_src.topics.long_sequences.attention import Work, layout_of, pad, shard, tensors
from lab_src.topics.long_sequences.records import ULYSSES_FUNCTION


def ulysses_function():
    """The answer cell's `ulysses_attention` (the student's, or in the grader the reference's)."""
    qid = exercises.ring_attention.exercise.id
    ring = answers.load(qid)
    if ring is None:
        raise answers.StubCalled(answers.stub_message(qid))
    found = getattr(ring, "__globals__", {}).get(ULYSSES_FUNCTION)
    if not callable(found):
        raise answers.AnswerError(f"{qid}: your answer cell must define {ULYSSES_FUNCTION}(q, k, v, causal, group) "
                                  f"beside ring_attention")
    return found


def answer_line(e: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "q24_" in (f.filename or "")]
    return f"line {frames[-1].lineno}: {frames[-1].line}" if frames else ""


def phase(tracer, start: int, work: Work, t0: float) -> dict:
    """What the rank did from event `start` on: its messages, collectives and matmuls."""
    events = tracer.events[start:]
    return {"sends": [[e.peer, e.bytes, e.t_start, e.t_end] for e in events if e.is_send],
            "recvs": [[e.peer, e.bytes, e.t_start, e.t_end] for e in events if e.is_recv],
            "collectives": [[e.kind, e.bytes, e.t_start, e.t_end] for e in events if e.is_collective],
            "matmuls": list(work.matmuls), "span": [t0, time.perf_counter()]}


def returned_problem(out, q: torch.Tensor) -> str:
    if not isinstance(out, torch.Tensor):
        return f"{type(out).__name__}, not a tensor"
    if tuple(out.shape) != tuple(q.shape):
        return f"a tensor of shape {tuple(out.shape)}, not q's {tuple(q.shape)} (this rank's rows of every head)"
    if not out.requires_grad:
        return "a tensor that does not require grad: no gradient can reach q, k and v through it"
    return ""


def run_one(run: dict, index: int, case: Case, group, tracer, perturbed, rec: dict) -> None:
    cfg, s = case.config, settings_of(case)
    n, rank = dist.get_world_size(group), dist.get_rank(group)
    layout = layout_of(run)
    q, k, v, dout = (shard(pad(t, n, layout), rank, n, layout)
                     for t in tensors(run, cfg.seed, index, s.batch, s.dtype, perturbed))
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    start, t0 = len(tracer.events), time.perf_counter()
    with Work() as work:
        if run["fn"] == "ring":
            out = exercises.ring_attention(q, k, v, run["causal"], layout, group)
        else:
            out = ulysses_function()(q, k, v, run["causal"], group)
    rec["forward"] = phase(tracer, start, work, t0)
    rec["returned"] = returned_problem(out, q)
    if rec["returned"]:
        return
    rec["out"] = out.detach().clone()
    start, t0 = len(tracer.events), time.perf_counter()
    with Work() as work:
        out.backward(dout)
    rec["backward"] = phase(tracer, start, work, t0)
    for name, t in (("dq", q), ("dk", k), ("dv", v)):
        rec[name] = None if t.grad is None else t.grad.detach().clone()


def run(case: Case, ctx, group, tracer, obs) -> None:
    s = settings_of(case)
    perturbed = None
    try:
        coll.CASE_RANKS[:] = range(case.stages)
        if getattr(s, "perturb", False):
            perturbed = int(case_barrier.shared("attention inputs", lambda: str(perturb.new_seed())))
        runs = obs["runs"] = []
        for index, spec in enumerate(s.runs):
            observe.barrier(group)
            rec: dict = {}
            runs.append(rec)
            try:
                run_one(spec, index, case, group, tracer, perturbed, rec)
            except (answers.StubCalled, waiting.StoppedWaiting, coll.CollectiveGaveUp):
                raise
            except Exception as e:  # noqa: BLE001 - a run that raises is an observation; the next one runs
                message = str(e) or ("still the stub from the release (raise NotImplementedError())"
                                     if isinstance(e, NotImplementedError) else "")
                rec["raised"] = {"type": type(e).__name__, "message": message[:800], "line": answer_line(e)}
        observe.finish_messages(None, group, tracer)
    finally:
        coll.CASE_RANKS.clear()
        if perturbed is not None and ctx.rank == 0:
            obs["perturbed"] = perturbed
        observe.record_instrumentation(obs, tracer)
