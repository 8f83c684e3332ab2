"""`MixedGroup`: what q26's `mixed_precision_layer` and `LossScaler` are given (rank side), q22's FsdpGroup's
interface (topics/sharding/fsdp.py) for a shard computed in a lower precision:

    dp.size, dp.rank, dp.group, dp.ranks
    full = dp.all_gather(shard.to(torch.bfloat16))   the whole flat vector, in the dtype it was given (a new tensor)
    part = dp.reduce_scatter(flat_grad)              this rank's shard of the group's sum, in flat_grad's dtype
    dp.all_reduce(t)                                 t summed over the group, in place (the found-inf flag)

All three run on the answer's q19 ring where the kind gives it (`ring`; in grading the reference's), as q22's do: a
gather is the ring's all-reduce of the whole flat vector, zero but for this rank's shard; a reduce-scatter the ring's
all-reduce and a slice. Without a ring (benchmarks/mixed_precision_vs_torch.py) they are gloo's. A gather takes a
cast of the shard, a new tensor: the shard is known by its length (this rank's shard's of a registered block). Each
call is noted with its bytes and elements (what the ring carried: the tensor of the dtype it was given), and with a
tracer each gather and reduce-scatter is an event of the timeline's lane 1 (q22's "allgather_fsdp",
"reducescatter_fsdp"), the ring's messages in that lane too. The judge reads the bytes from these notes, not from the
answer's claims. (A class of its own, not a subclass of q22's: a topic stands at most two floors above the core.)
"""
from __future__ import annotations

import threading
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from lab_src.comm import collectives, lanes
from lab_src.pipeline import waiting
from lab_src.pipeline.trace import Event
from lab_src.topics.mixed_precision.records import shard_bounds


class MixedGroup:
    def __init__(self, group, ranks: list[int], rank: int):
        self.group, self.ranks = group, list(ranks)
        self.size, self.rank = len(self.ranks), self.ranks.index(rank)
        self.by_length: dict[int, tuple[str, int]] = {}     # this rank's shard length -> (layer, its flat length)
        self.gathers: list[list] = []                       # [time, layer, bytes, elements] of each all_gather
        self.scatters: list[list] = []                      # [time, bytes, elements] of each reduce_scatter
        self.reduces: list[list] = []                       # [bytes, elements] of each all_reduce of the step
        self.tracer = None                                  # the rank's Tracer, set by the kind
        self.ring = None                                    # ring(tensor, group) summing in place (q19's); None: gloo
        self._alive: list[StorageWeakRef] = []              # the gathered copies' storages (the memory lane's)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"MixedGroup(size={self.size}, rank={self.rank}, ranks={self.ranks})"

    def register(self, name: str, shard: torch.Tensor, total: int) -> None:
        """The lab's note of a block's shard: its name and its whole flat length (every rank's shard length follows:
        torch.tensor_split's)."""
        self.by_length.setdefault(shard.numel(), (name, total))

    def new_step(self) -> None:
        self.gathers, self.scatters, self.reduces = [], [], []

    def _record(self, kind: str, t_start: float, flat: torch.Tensor) -> None:
        if self.tracer is not None:
            self.tracer.record(Event(self.tracer.rank, kind, None, None, (flat.numel(),),
                                     flat.numel() * flat.element_size(), t_start, time.perf_counter(),
                                     group=tuple(self.ranks), lane=1))

    def _sum(self, tensor: torch.Tensor) -> None:
        """`tensor` summed over the group in place by the answer's ring, its messages in the rank's lane 1."""
        if self.size == 1:
            return
        with lanes.inline(self.tracer):
            self.ring(tensor, self.group)

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The whole flat vector whose shard `dp.rank` this rank holds (or a cast of it), in `shard`'s dtype."""
        if not isinstance(shard, torch.Tensor) or shard.dim() != 1:
            raise TypeError(f"dp.all_gather takes this rank's shard (or a cast of it), a 1-D tensor; got "
                            f"{getattr(shard, 'shape', type(shard).__name__)}")
        known = self.by_length.get(shard.numel())
        if known is None:
            raise ValueError(f"dp.all_gather got {shard.numel():,} elements, the length of no block's shard on this "
                             f"rank ({', '.join(f'{n}: {k:,}' for k, (n, _) in sorted(self.by_length.items()))})")
        layer, total = known
        t_start = time.perf_counter()
        if self.ring is not None or self.size == 1:
            start, end = shard_bounds(total, self.size, self.rank)
            full = torch.zeros(total, dtype=shard.dtype, device=shard.device)
            full[start:end] = shard.detach()
            self._sum(full)
        else:
            full = self._gather_gloo(shard.detach(), total)
        self.gathers.append([time.perf_counter(), layer, full.numel() * full.element_size(), full.numel()])
        with self._lock:
            self._alive.append(StorageWeakRef(full.untyped_storage()))
        self._record("allgather_fsdp", t_start, full)
        return full

    def gathered_bytes(self) -> int:
        """The bytes of the gathered copies whose storage something still holds (the timeline's memory lane: q22's
        watch, without its records of who held them how long)."""
        total = 0
        with self._lock:
            for ref in list(self._alive):
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                if storage is None:
                    self._alive.remove(ref)
                else:
                    total += storage.nbytes()
                del storage
        return total

    def gather_raw(self, shard: torch.Tensor) -> torch.Tensor:
        """The gather itself, not noted (a benchmark's reading of the shards after the steps)."""
        known = self.by_length.get(shard.numel())
        if known is None:
            raise ValueError(f"no block's shard has {shard.numel():,} elements on this rank")
        return self._gather_gloo(shard.detach(), known[1]) if self.size > 1 else shard.detach().clone()

    def _gather_gloo(self, shard: torch.Tensor, total: int) -> torch.Tensor:
        counts = [end - start for start, end in (shard_bounds(total, self.size, i) for i in range(self.size))]
        width = max(counts)
        padded = torch.zeros(width, dtype=shard.dtype, device=shard.device)
        padded[:shard.numel()] = shard
        out = torch.empty(width * self.size, dtype=shard.dtype, device=shard.device)
        waiting.wait(collectives.lab("all_gather_single")(out, padded, group=self.group, async_op=True))
        return torch.cat([row[:c] for row, c in zip(out.view(self.size, width), counts)])

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the sum over the group of `flat` (a 1-D tensor, the same length on every rank)."""
        if not isinstance(flat, torch.Tensor) or flat.dim() != 1:
            raise TypeError(f"dp.reduce_scatter takes a block's whole flat gradient, a 1-D tensor; got "
                            f"{getattr(flat, 'shape', type(flat).__name__)}")
        t_start = time.perf_counter()
        start, end = shard_bounds(flat.numel(), self.size, self.rank)
        if self.ring is None and self.size > 1:
            part = self._reduce_scatter_gloo(flat)
        else:
            total = flat.detach().clone()
            self._sum(total)
            part = total[start:end].clone()
        self.scatters.append([time.perf_counter(), flat.numel() * flat.element_size(), flat.numel()])
        self._record("reducescatter_fsdp", t_start, flat)
        return part

    def _reduce_scatter_gloo(self, flat: torch.Tensor) -> torch.Tensor:
        bounds = [shard_bounds(flat.numel(), self.size, i) for i in range(self.size)]
        width = max(end - start for start, end in bounds)
        rows = torch.zeros(self.size, width, dtype=flat.dtype, device=flat.device)
        for row, (start, end) in zip(rows, bounds):
            row[:end - start] = flat.detach()[start:end]
        out = torch.empty(width, dtype=flat.dtype, device=flat.device)
        waiting.wait(collectives.lab("reduce_scatter_single")(out, rows.view(-1), group=self.group, async_op=True))
        start, end = bounds[self.rank]
        return out[:end - start]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the group, in place; returns it."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"dp.all_reduce takes a tensor, got {type(tensor).__name__}")
        if self.size > 1:
            if self.ring is not None:
                flat = tensor.detach().reshape(-1).clone()
                self._sum(flat)
                tensor.detach().copy_(flat.view_as(tensor))
            else:
                waiting.wait(collectives.lab("all_reduce")(tensor, group=self.group, async_op=True))
        self.reduces.append([tensor.numel() * tensor.element_size(), tensor.numel()])
        return tensor
