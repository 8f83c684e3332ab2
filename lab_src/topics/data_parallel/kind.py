"""Rank side of q19 (ring_all_reduce): each rank sums, one length after another, its own tensor over its ring
with the answer's `ring_all_reduce`, and records what it holds afterwards and every message it made.

The ring is the case's ranks, or (settings "columns") the data-parallel columns of a grid of them, whose
groups every rank creates. The tensors come from inputs.py (the case's seed, the length, the position in
the ring). Between lengths the ranks meet at a barrier, so one length's messages never mix with the next's.
For each length the rank records (plain values, never a verdict): whether the call raised, what it
returned, the result's digest, float64 sum and (whole, or a random sample of) its values, the sends and
receives it made (peer's global rank, bytes: comm/messages.py records the answer's own torch.distributed
calls) and any collective it called (comm/collectives.py), what each message sent carried (its elements,
first and last element and float64 sum: comm/messages.py CARRIED), and which of its messages' requests the answer let
go of before their wait() (comm/messages.py UNWAITED: gloo would drop them, and the peer wait for ever; the lab keeps
those requests until the case ends, so that the run goes on and the judge names them).

With settings "perturb" (every hidden case), the case's rank 0 draws a seed (os.urandom, pipeline/perturb.py) and
hands it to the case's ranks through the launch's store (harness/case_barrier.shared), never through a message of
the answer's; each rank changes its inputs by noise drawn from it before calling the answer (inputs.input_of), and
rank 0 reports the seed once the calls are over. A rank that redraws the inputs from the configuration's seed then
sums numbers no rank held.

Every send goes through the rank's SizedLinks (sizes.py): posted once the receive it matches is posted, and only if
of its size; a send of another size is held back (gloo would abort the receiving process) and named, and every rank
of the case stops waiting at once.
"""
from __future__ import annotations

import hashlib
import os
import time

import torch
import torch.distributed as dist

from lab_src import exercises
from lab_src.comm import collectives as coll
from lab_src.comm import messages
from lab_src.comm.mesh import Mesh
from lab_src.harness import case_barrier, observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import perturb, waiting
from lab_src.topics.data_parallel.inputs import input_of
from lab_src.topics.data_parallel.records import SAMPLED, WHOLE
from lab_src.topics.data_parallel.sizes import SizedLinks


def ring_mesh(case: Case, ctx, group) -> Mesh:
    """The case's ranks as rings along "dp": all of them (the case's own group), or (settings "columns") the
    data-parallel columns of a (dp, pp) grid of them, whose groups every rank of the case makes, in the same order."""
    return Mesh.of(case, ctx, whole=group).build("dp")


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().cpu().contiguous().view(-1).numpy().tobytes()).hexdigest()[:20]


def held(t: torch.Tensor) -> dict:
    """What a tensor holds, in a form that travels: whole when short, else a sample the answer cannot know."""
    flat = t.detach().cpu().reshape(-1)
    out = {"digest": digest(flat), "sum64": float(flat.double().sum())}
    if flat.numel() <= WHOLE:
        out["whole"] = flat.clone()
    else:
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(6), "little"))
        idx = torch.randperm(flat.numel(), generator=g)[:SAMPLED].sort().values
        out["sample"] = [idx, flat[idx].clone()]
    return out


def sum_once(tensor: torch.Tensor, group, tracer) -> dict:
    """One call of the answer on `tensor`. An exception goes on up: the worker reports it, the answer's line
    first, and the case ends (harness/worker.py); the record says which length the rank was summing."""
    start, carried, t0 = len(tracer.events), len(messages.CARRIED or ()), time.perf_counter()
    posted, unwaited = dict(messages.POSTED), len(messages.UNWAITED or ())
    returned = exercises.ring_all_reduce(tensor, group)
    rec = {"length": tensor.numel(), "dtype": str(tensor.dtype).replace("torch.", ""),
           "seconds": time.perf_counter() - t0,
           "returned": ("none" if returned is None else "same" if returned is tensor else
                        "tensor" if isinstance(returned, torch.Tensor) else type(returned).__name__)}
    rec.update(held(tensor))
    if isinstance(returned, torch.Tensor) and returned is not tensor and returned.numel() == tensor.numel():
        rec["returned_digest"] = digest(returned)
    events = tracer.events[start:]
    rec["sends"] = [[e.peer, e.bytes] for e in events if e.is_send]
    rec["recvs"] = [[e.peer, e.bytes] for e in events if e.is_recv]
    rec["collectives"] = [e.kind for e in events if e.is_collective]
    rec["carried"] = list((messages.CARRIED or [])[carried:])
    # the messages whose requests the answer let go of unwaited: which send or receive of this call each was
    rec["unwaited"] = [[what, peer, number - posted[what]] for what, peer, number in (messages.UNWAITED or [])[unwaited:]]
    return rec


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, s = case.config, settings_of(case)
    perturbed = links = None
    try:
        coll.CASE_RANKS[:] = range(case.stages)
        messages.CARRIED = []
        messages.UNWAITED = []
        if s.perturb:
            perturbed = int(case_barrier.shared("ring inputs", lambda: str(perturb.new_seed())))
        mesh = ring_mesh(case, ctx, group)
        ring, ranks = mesh.entry("dp")
        position = ranks.index(ctx.rank)
        obs["group"], obs["position"] = ranks, position
        runs = obs["runs"] = []
        # every send held against the receive it matches (sizes.py); a send held back stops every rank's wait
        links = SizedLinks(dist.distributed_c10d._get_default_store(), f"lab-ring-size/{case.index}", ctx.rank,
                           messages._ORIGINAL["isend"])
        messages.NETWORK[0] = links
        with waiting.also_stop_when(links.stop):
            for length in s.lengths:
                observe.barrier(group)
                x = input_of(cfg.seed, length, position, cfg.dtype, perturbed).to(ctx.device)
                obs["summing"] = length
                links.begin(x, len(ranks))
                runs.append(sum_once(x, ring, tracer))
        observe.finish_messages(None, group, tracer)
        mesh.destroy()          # a column's groups hold threads of the collective library; the case's own is kept
    finally:
        if links is not None:
            messages.NETWORK[0] = None
            links.close()
        coll.CASE_RANKS.clear()
        messages.CARRIED = None
        messages.UNWAITED = None
        messages.UNWAITED_KEPT.clear()          # the case's messages are over: a request kept for it is let go
        if perturbed is not None and ctx.rank == 0:
            obs["perturbed"] = perturbed
        observe.record_instrumentation(obs, tracer)
