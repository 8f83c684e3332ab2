"""`FsdpGroup`: what q22's `fsdp_layer` is given to gather and scatter a layer's parameters (rank side).

    dp.size, dp.rank, dp.group   the data-parallel group of this stage's replicas, and this rank's position
    full = dp.all_gather(shard)  every rank's shard of a layer's flat parameters, concatenated: the whole flat
                                 vector (a new tensor; torch.tensor_split's shards, so uneven sizes are fine)
    part = dp.reduce_scatter(g)  the sum over the group of the flat vector g, this rank's shard of it

Both run on the student's own q19 ring where the kind gives it (`ring`; in grading the reference's ring), as q20's
buckets do: a reduce-scatter is the ring's all-reduce and a slice, a gather the ring's all-reduce of the whole flat
vector, zero but for this rank's shard (the ring's first half then sums zeros: twice the bytes of an all-gather, the
price of reusing q19 as it is). The ring's messages are recorded in lane 1, the row under the rank's own. Without a
ring (benchmarks/fsdp_vs_torch.py) they are gloo's all-gather and reduce-scatter (shards padded to the longest);
each counts as one gather or reduce-scatter. Each call is noted: its time, the shard's layer (`names`, filled by the
kind), the bytes; and every gathered tensor's storage is watched (a weak reference to it: `_held`), so that the kind
knows at every moment how many gathered bytes the rank holds, and which layers they are: a layer gathered and never
freed, or kept for the whole step, shows as bytes that stay. With a tracer, each call is also an event of the
timeline ("allgather_fsdp", "reducescatter_fsdp"), drawn in a row under the rank's own: it runs inside the forward
or backward box it belongs to. It is recorded when it ends and not journalled: the deadlock watch sees the forward
or backward around it.
"""
from __future__ import annotations

import threading
import time

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from lab_src.comm import collectives, lanes
from lab_src.pipeline import waiting
from lab_src.pipeline.trace import Event
from lab_src.topics.sharding.records import shard_bounds


class FsdpGroup:
    def __init__(self, group, ranks: list[int], rank: int):
        self.group, self.ranks = group, list(ranks)
        self.size, self.rank = len(self.ranks), self.ranks.index(rank)
        self.names: dict[int, str] = {}           # a shard's storage pointer -> its layer's name ("blocks.3")
        self.totals: dict[int, int] = {}          # a shard's storage pointer -> its layer's flat length
        self.layer_of_length: dict[int, str] = {}  # a flat length -> a layer of that length
        self.gathers: list[list] = []             # [time, layer, bytes] of each all_gather of the step
        self.scatters: list[list] = []            # [time, layer, bytes] of each reduce_scatter of the step
        # every gathered copy whose storage is still there: id -> (layer, since, a weak reference to its storage)
        self.alive: dict[int, tuple[str, float, StorageWeakRef]] = {}
        self.peak = 0                             # the most gathered bytes held at once in the step
        self.peak_layers: list[str] = []          # the layers held at that moment
        self.longest: dict[str, float] = {}       # layer -> the longest a gathered copy of it was held (s)
        self._lock = threading.Lock()
        self._next = 0
        self.tracer = None                        # pipeline/trace.py's Tracer of the rank, set by the kind
        self.on_backward_gather = None            # (layer) -> None: called after each gather of a backward (the kind's)
        self.ring = None                          # ring(tensor, group) summing in place (q19's): the kind's; None: gloo

    def _record(self, kind: str, t_start: float, flat: torch.Tensor) -> None:
        if self.tracer is not None:
            self.tracer.record(Event(self.tracer.rank, kind, None, None, (flat.numel(),),
                                     flat.numel() * flat.element_size(), t_start, time.perf_counter(),
                                     group=tuple(self.ranks), lane=1))

    def __repr__(self) -> str:
        return f"FsdpGroup(size={self.size}, rank={self.rank}, ranks={self.ranks})"

    def new_step(self) -> None:
        self.gathers, self.scatters, self.longest = [], [], {}
        self.peak, self.peak_layers = self._held()

    def register(self, name: str, shard: torch.Tensor, total: int) -> None:
        """The lab's note of a layer's shard: its name, and its whole flat length (every rank's shard's length
        follows from it, torch.tensor_split's, so a gather of it needs no exchange of sizes first)."""
        ptr = shard.untyped_storage().data_ptr()
        self.names[ptr], self.totals[ptr] = name, total
        self.layer_of_length[total] = name

    def _layer(self, shard: torch.Tensor) -> str:
        return self.names.get(shard.untyped_storage().data_ptr(), "a tensor that is no layer's shard")

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        """The whole flat vector whose shard `dp.rank` this rank holds: a new tensor, every rank's shard in order."""
        if not isinstance(shard, torch.Tensor) or shard.dim() != 1:
            raise TypeError(f"dp.all_gather takes this rank's shard, a 1-D tensor; got "
                            f"{getattr(shard, 'shape', type(shard).__name__)}")
        layer = self._layer(shard)
        t_start = time.perf_counter()
        total = self.totals.get(shard.untyped_storage().data_ptr())
        if self.ring is not None and total is not None:
            # on the answer's ring: the whole flat vector, zero but for this rank's shard, summed over the group
            self._counts(shard, total)
            start, end = shard_bounds(total, self.size, self.rank)
            full = torch.zeros(total, dtype=shard.dtype, device=shard.device)
            full[start:end] = shard.detach()
            self._sum(full)
        else:
            full = self.gather_raw(shard)
        nbytes = full.numel() * full.element_size()
        now = time.perf_counter()
        self.gathers.append([now, layer, nbytes])
        with self._lock:
            key = self._next
            self._next += 1
            self.alive[key] = (layer, now, StorageWeakRef(full.untyped_storage()))
        held, layers = self._held()
        if held > self.peak:
            self.peak, self.peak_layers = held, layers
        self._record("allgather_fsdp", t_start, full)
        if self.on_backward_gather is not None and self._in_backward():
            self.on_backward_gather(layer)
        return full

    def _in_backward(self) -> bool:
        """Whether this thread is in a backward of the pipeline (the tracer's operation in progress)."""
        pending = self.tracer.pending if self.tracer is not None else None
        return pending is not None and pending.kind.startswith("backward")

    def gather_raw(self, shard: torch.Tensor, total: int | None = None) -> torch.Tensor:
        """The gather itself, neither noted nor watched (the kind's own reading of the shards' gradients). The
        shards' lengths follow from the layer's whole length where the lab knows it (`total`, or a registered
        shard's); otherwise the ranks exchange them first."""
        gather = collectives.lab("all_gather")
        total = total if total is not None else self.totals.get(shard.untyped_storage().data_ptr())
        if total is not None:
            counts = self._counts(shard, total)
        else:
            sizes = torch.tensor([shard.numel()], dtype=torch.int64)
            every = [torch.empty_like(sizes) for _ in self.ranks]
            if self.size > 1:
                waiting.wait(gather(every, sizes, group=self.group, async_op=True))
            else:
                every = [sizes]
            counts = [int(c) for c in every]
        width = max(counts)
        if shard.numel() == width:
            padded = shard.detach()
        else:
            padded = torch.zeros(width, dtype=shard.dtype, device=shard.device)
            padded[:shard.numel()] = shard.detach()
        if self.size == 1:
            return padded[:counts[0]].clone()
        out = torch.empty(width * self.size, dtype=shard.dtype, device=shard.device)
        into = collectives.lab("all_gather_single")
        waiting.wait(into(out, padded.contiguous(), group=self.group, async_op=True))
        if all(c == width for c in counts):
            # a copy: gloo's worker thread may hold the buffer it gathered into a little after the wait returns, so
            # that the copy the answer frees would outlive it by chance (the benchmark saw two layers held at once)
            return out.clone()
        return torch.cat([row[:c] for row, c in zip(out.view(self.size, width), counts)])

    def _counts(self, shard: torch.Tensor, total: int) -> list[int]:
        """Every rank's shard length of a flat vector of `total` elements; this rank's `shard` must be its own."""
        counts = [end - start for start, end in (shard_bounds(total, self.size, i) for i in range(self.size))]
        if shard.numel() != counts[self.rank]:
            raise ValueError(f"dp.all_gather got {shard.numel():,} elements; this rank's shard of {self._layer(shard)} "
                             f"is {counts[self.rank]:,} (shard {self.rank} of its {total:,} flattened parameters)")
        return counts

    def _reduce_scatter_gloo(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the sum over the group of `flat`, by gloo's reduce-scatter (each shard padded to
        the longest, torch.tensor_split's shards being uneven where the length does not divide by n)."""
        bounds = [shard_bounds(flat.numel(), self.size, i) for i in range(self.size)]
        width = max(end - start for start, end in bounds)
        if all(end - start == width for start, end in bounds):
            rows = flat.detach().contiguous()
        else:
            rows = torch.zeros(self.size, width, dtype=flat.dtype, device=flat.device)
            for row, (start, end) in zip(rows, bounds):
                row[:end - start] = flat.detach()[start:end]
            rows = rows.view(-1)
        out = torch.empty(width, dtype=flat.dtype, device=flat.device)
        scatter = collectives.lab("reduce_scatter_single")
        waiting.wait(scatter(out, rows, group=self.group, async_op=True))
        start, end = bounds[self.rank]
        return out[:end - start]

    def _sum(self, tensor: torch.Tensor) -> None:
        """`tensor` summed over the group in place by the answer's q19 ring (`ring`): its messages are recorded in
        the rank's lane 1, the row under its own, since they run inside a forward or a backward."""
        if self.size == 1:
            return
        # the forward or backward around it is the main lane's; its messages are the ring's own operations
        with lanes.inline(self.tracer):
            self.ring(tensor, self.group)

    def _held(self) -> tuple[int, list[str]]:
        """The gathered bytes held now and whose: every gathered copy's storage that is still there, at its size
        now (a storage emptied with `untyped_storage().resize_(0)`, FSDP1's way, holds nothing until it is filled
        again). The storage, not the tensor: a `.detach()` of the copy, kept anywhere, keeps its storage and is
        counted; a copy is let go when nothing reaches its storage (noted in `longest` then)."""
        total, layers = 0, []
        with self._lock:
            for key, (layer, since, ref) in list(self.alive.items()):
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                nbytes = storage.nbytes() if storage is not None else None
                del storage
                if nbytes is None:
                    del self.alive[key]
                    self.longest[layer] = max(self.longest.get(layer, 0.0), time.perf_counter() - since)
                elif nbytes:
                    total += nbytes
                    layers.append(layer)
        return total, layers

    def reduce_scatter(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the sum over the group of `flat` (a 1-D tensor, the same length on every rank)."""
        if not isinstance(flat, torch.Tensor) or flat.dim() != 1:
            raise TypeError(f"dp.reduce_scatter takes a layer's whole flat gradient, a 1-D tensor; got "
                            f"{getattr(flat, 'shape', type(flat).__name__)}")
        t_start = time.perf_counter()
        start, end = shard_bounds(flat.numel(), self.size, self.rank)
        if self.ring is None and self.size > 1:
            part = self._reduce_scatter_gloo(flat)
        else:
            total = flat.detach().clone()
            self._sum(total)
            part = total[start:end].clone()
        nbytes = flat.numel() * flat.element_size()
        # the layer, where its size says it (two blocks of one size: either; the judge counts them per stage)
        self.scatters.append([time.perf_counter(), self.layer_of_length.get(flat.numel(), "?"), nbytes])
        self._record("reducescatter_fsdp", t_start, flat)
        return part

    def gathered_addresses(self) -> set[int]:
        """The storage addresses of the gathered copies alive now (those emptied too: their address is 0)."""
        out = set()
        with self._lock:
            for _, _, ref in self.alive.values():
                storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
                if storage is not None:
                    out.add(storage.data_ptr())
                del storage
        return out

    def gathered_bytes(self) -> int:
        return self._held()[0]

    def gathered_now(self) -> list[str]:
        return self._held()[1]
