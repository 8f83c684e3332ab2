"""Process-group setup for one torchrun worker.

Backend: NCCL when every local rank has its own GPU, gloo on the CPU otherwise; ``LAB_BACKEND``
overrides. Every group is created with a timeout, so a receive that never gets its message raises
instead of waiting forever.

Pipeline groups: a check may run a 2-stage and a 4-stage pipeline in one launch of 4 processes. A
p-stage pipeline runs on ranks 0..p-1 through its own group, and the ranks talk in pipeline ranks
(`group_src`/`group_dst` of torch.distributed). A failed case poisons its group (a message may still
be in flight), so `fresh()` replaces every pipeline group before the next case. A case's kind may ask
for a longer timeout (tensor parallelism: harness/limits.py COLLECTIVE_TIMEOUT_FACTOR): a group per size
and timeout.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    timeout_s: float


def timeout(seconds: float) -> datetime.timedelta:
    """A process group's timeout of `seconds`: the one place the lab turns seconds into one (comm/mesh.py, q14's Grid
    and the groups here call it)."""
    return datetime.timedelta(seconds=seconds)


def choose_backend(local_world_size: int) -> tuple[str, torch.device, int]:
    forced = os.environ.get("LAB_BACKEND")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    backend = forced or ("nccl" if has_gpus else "gloo")
    if backend == "nccl":
        if not has_gpus:
            raise RuntimeError(f"LAB_BACKEND=nccl needs one GPU per rank: {local_world_size} ranks, "
                               f"{torch.cuda.device_count()} GPUs")
        torch.cuda.set_device(local_rank)
        return backend, torch.device("cuda", local_rank), local_rank
    return backend, torch.device("cpu"), local_rank


def device_for(nproc: int) -> str:
    """Where a launch of `nproc` ranks will compute ("cuda" or "cpu"), so that a process outside the
    launch (the one computing the baseline) uses the same kind of device and the same kernels."""
    forced = os.environ.get("LAB_BACKEND")
    has_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= nproc
    return "cuda" if forced != "gloo" and (forced == "nccl" or has_gpus) else "cpu"


def init(timeout_s: float, world_timeout_s: float | None = None) -> Dist:
    """Join the torchrun job (RANK, WORLD_SIZE, MASTER_ADDR... come from torchrun's environment).

    `timeout_s` bounds each operation of a pipeline group; the world group, whose barriers wait for
    the slowest rank's whole case, gets the longer `world_timeout_s`.
    """
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", 1)))
    backend, device, local_rank = choose_backend(local_world)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    world_timeout = timeout(world_timeout_s or 4 * timeout_s + 30)
    dist.init_process_group(backend, timeout=world_timeout, **kwargs)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank, backend, device, timeout_s)


class PipeGroups:
    """Pipeline groups by size and timeout, created collectively: every rank must call `get` in the same order."""

    def __init__(self, ctx: Dist):
        self.ctx = ctx
        self._groups: dict = {}

    def get(self, size: int, timeout_s: float | None = None):
        """The process group of a `size`-stage pipeline on global ranks 0..size-1, whose operations give up
        after `timeout_s` (the launch's timeout when None)."""
        timeout_s = timeout_s or self.ctx.timeout_s
        if (size, timeout_s) not in self._groups:
            self._groups[(size, timeout_s)] = dist.new_group(list(range(size)), timeout=timeout(timeout_s))
        return self._groups[(size, timeout_s)]

    def fresh(self) -> None:
        """Forget every pipeline group; the next `get` builds new ones."""
        self._groups.clear()
