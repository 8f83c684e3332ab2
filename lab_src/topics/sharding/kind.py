"""Rank side of q21 (sharded_adamw_step): on a data x pipeline grid of all the case's ranks (the layout of q14:
global rank = dp_rank * pp_size + pp_rank), each replica's stage runs a 1F1B step (q12; in grading the
reference's), then the answer's `sharded_adamw_step(params, dp, state, lr, betas=, eps=, weight_decay=)` (the
case's AdamW settings) over the stage's data-parallel group, `steps` times; the `state` dict is the answer's, handed back at every step.

Recorded per rank and step (plain values, never a verdict): the parameters after the step, the bytes of tensors
the answer's `state` holds (what it keeps of AdamW's state) and, after the first step, those tensors themselves
(`state_values`: which elements the rank's moments are of), the gradients still held after the step, every
message the answer sent or received (comm/messages.py records its raw calls) and any collective it called
(comm/collectives.py); and, before the first step, the replica's own gradient (`own_grad`). judge.py compares
with one process's AdamW.
"""
from __future__ import annotations

import time

import torch

from lab_src import exercises
from lab_src.comm.grid import grid_case
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.live import LiveTensors, addresses
from lab_src.harness.memory import counting
from lab_src.harness.settings import settings_of


class DataParallelGroup:
    """What the answer is given of its data-parallel group: `group` (a process group), `size` (n), `rank` (this
    rank's position in it, 0..n-1), `ranks` (the group's global ranks, in position order)."""

    def __init__(self, group, ranks: list[int], rank: int):
        self.group, self.ranks = group, list(ranks)
        self.size, self.rank = len(self.ranks), self.ranks.index(rank)

    def __repr__(self) -> str:
        return f"DataParallelGroup(size={self.size}, rank={self.rank}, ranks={self.ranks})"


def held_bytes(value, seen=None, skip=()) -> tuple[int, int, int]:
    """(bytes, tensors, elements of the largest) of the tensors inside `value` (dicts, lists, tuples, objects'
    __dict__, modules' parameters and submodules), each storage counted once; objects in `skip` (the lab's own)
    and objects without a __dict__ are not looked into."""
    seen = set() if seen is None else seen
    if any(value is s for s in skip):
        return 0, 0, 0
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.untyped_storage().nbytes())
        if key in seen:
            return 0, 0, 0
        seen.add(key)
        return value.untyped_storage().nbytes(), 1, value.numel()
    items = []
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple, set)):
        items = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, type) and id(value) not in seen:
        seen.add(id(value))
        try:
            items = list(vars(value).values())
        except TypeError:
            items = []
    total = count = largest = 0
    for item in items:
        b, c, big = held_bytes(item, seen, skip)
        total, count, largest = total + b, count + c, max(largest, big)
    return total, count, largest


def floating_tensors(value, found=None, depth: int = 0) -> list:
    """The floating-point tensors of more than one element inside `value` (dicts, lists, tuples), at most 8, each
    flattened: what a rank's AdamW `state` keeps of its moments."""
    found = [] if found is None else found
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() and value.numel() > 1 and len(found) < 8:
            found.append(value.detach().cpu().reshape(-1).clone())
    elif isinstance(value, dict) and depth < 3:
        for item in value.values():
            floating_tensors(item, found, depth + 1)
    elif isinstance(value, (list, tuple)) and depth < 3:
        for item in value:
            floating_tensors(item, found, depth + 1)
    return found


def storage_bytes(tensors) -> int:
    """Bytes of the storages under `tensors`, each counted once."""
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total


def reachable_addresses(*values) -> set[int]:
    """The storage addresses of every tensor inside `values` (as `held_bytes` walks them)."""
    seen: set = set()
    for value in values:
        held_bytes(value, seen)
    return {key[0] for key in seen if isinstance(key, tuple)}


def grad_bytes(params) -> int:
    return storage_bytes([p.grad for p in params if p.grad is not None])


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    with grid_case(case, ctx, group, tracer, obs) as grid:
        try:
            stage = grid.stage()
            params = list(stage.parameters())
            obs["dp_group"] = grid.dp_ranks
            obs["elements"] = sum(p.numel() for p in params)
            obs["element_size"] = params[0].element_size()
            dp = DataParallelGroup(grid.dp_group, grid.dp_ranks, ctx.rank)
            state: dict = {}
            kept = storage_bytes(params)
            # every event carries the training state the rank holds (the timeline's memory lane): its parameters,
            # their gradients, and what the answer's `state` holds; the 1F1B step's activations are counted too
            tracer.state_memory = lambda: (kept, 0, grad_bytes(params), held_bytes(state)[0])
            steps = obs["steps"] = []
            # the rank's memory beyond what the lab declared (harness/live.py): after a step, every live tensor
            # storage but the parameters, their gradients, `state`'s and the lab's records, and what was alive before
            # this case (the ranks run one case after another); what the step leaves alive outside `state` (a
            # module global, a closure, a cache) shows here
            live = LiveTensors()
            live.mark()

            def known() -> set[int]:
                return (addresses(params) | addresses(p.grad for p in params if p.grad is not None)
                        | reachable_addresses(state, obs))
            for k in range(settings.steps):
                observe.barrier(group)
                for p in params:
                    p.grad = None
                data_iter = grid.data_iter(stage)
                obs["stepping"] = k
                with counting(stage, tracer):
                    exercises.one_f_one_b_step(stage, data_iter, grid.m)
                if k == 0:      # the replica's own gradient, flat, before the answer reduces it (the judge's
                    # reading of which replicas' gradients each rank's shard summed: judge.py `shift_problem`)
                    obs["own_grad"] = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p))
                                                 .detach().reshape(-1) for p in params]).cpu().clone()
                start, t0 = len(tracer.events), time.perf_counter()
                with torch.no_grad():
                    returned = exercises.sharded_adamw_step(params, dp, state, settings.lr, **settings.adamw())
                seconds = time.perf_counter() - t0
                # after the first and the last step (a scan costs tens of milliseconds)
                found = live.scan(known()) if k in (0, settings.steps - 1) else None
                if returned is not None:
                    obs["returned"] = (f"sharded_adamw_step returns nothing; it returned "
                                       f"{observe.plain(returned)!r}")[:300]
                events = tracer.events[start:]
                nbytes, tensors, largest = held_bytes(state)
                steps.append({
                    "seconds": seconds,
                    "params": {n: p.detach().cpu().clone() for n, p in stage.named_parameters()},
                    "state_bytes": nbytes, "state_tensors": tensors, "largest_state": largest,
                    "grad_bytes": grad_bytes(params),
                    **({"hidden_bytes": found.bytes, "hidden_largest": found.largest} if found else {}),
                    "sends": [[e.peer, e.bytes] for e in events if e.is_send],
                    "recvs": [[e.peer, e.bytes] for e in events if e.is_recv],
                    "collectives": [e.kind for e in events if e.is_collective],
                    **({"state_values": floating_tensors(state)} if k == 0 else {}),
                })
            obs.pop("stepping", None)
            obs["scan_seconds"] = live.seconds
            grid.finish(stage)      # every rank is past its steps: nothing is in flight on the groups
        finally:
            tracer.state_memory = None
