"""Every tensor storage alive in the rank's process, found by the lab's code at the moments it chooses (issue 54).

    live = LiveTensors()
    live.mark()                              # what is alive now (an earlier case's, the lab's) is not counted
    with live.saving():                      # autograd's saved tensors are noted while the block runs
        step(...)
    found = live.scan(known)                 # Found(bytes, storages, largest): the storages nobody declared

What an answer keeps of a training's state need not be where the lab hands it over (q21's `state`, q22's gathered
copies): a module global, a closure's cell, an attribute of an autograd Function's `ctx`, a list somewhere. Each of
those holds a Python tensor object, and every Python tensor object of the process is in the garbage collector's
list (`gc.get_objects()`), whoever refers to it; a tensor autograd saved for a backward may have no Python object
left, so `saving()` notes each one as autograd packs it (`torch.autograd.graph.saved_tensors_hooks`) and keeps a
weak reference to its storage: what autograd saved is an activation, whatever it is, and is not counted. `scan` counts each storage once (by its address, at its size now: a storage emptied
with `resize_(0)` holds nothing), leaves out the storages the caller names as known (`known`: the parameters and
their gradients, the lab's own records, what the lab handed out and watches) and the storages of the autograd graph
(a tensor that requires a gradient, or was made by an operation that did: an activation, counted by the memory lane
as such), and what was alive at `mark()` (by identity), and sums the rest. Garbage is collected first (a cycle
through a frame or a closure holds nothing anyone can reach). The objects the worker froze out of the collector's
way once the answers were loaded (`gc.freeze()`, harness/worker.py) are not in its list: they are listed once, by
thawing them for as long as that takes, and again after any later freeze (gc.freeze is noted in this process).

What it cannot see (docs/threat-model.md): memory that is no torch tensor (a numpy copy, bytes, a list of floats, a
file), a copy made part of the autograd graph or saved for a backward by autograd (`ctx.save_for_backward` of a
clone: it counts as an activation), another process's memory, and an answer that installs saved-tensor hooks of its
own inside the lab's. It measures, it does not judge: the judges decide
from the figures (topics/sharding/judge.py, judge_fsdp.py).

Cost: a scan walks the collector's list, short in a rank once the worker froze what it loaded (a few ms); the
first of a process also lists the frozen objects (about 170,000: 40 ms on an idle core, 0.3 s measured on a loaded
one). The kinds scan at two moments of a case, not at every operation.
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import time
import weakref
from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef


@dataclass(frozen=True)
class Found:
    bytes: int = 0          # the storages' bytes, each counted once
    storages: int = 0       # how many storages
    largest: int = 0        # bytes of the largest


def _tensor_types() -> set:
    """torch.Tensor and every subclass of it defined so far (nn.Parameter, an answer's own), and the storages."""
    out, todo = set(), [torch.Tensor]
    while todo:
        tp = todo.pop()
        if tp not in out:
            out.add(tp)
            todo.extend(tp.__subclasses__())
    return out | {torch.UntypedStorage, torch.TypedStorage, *torch.TypedStorage.__subclasses__()}


def storage_of(value):
    """The untyped storage under a tensor or a storage; None for what has none (sparse, meta, nested)."""
    try:
        if isinstance(value, torch.Tensor):
            if value.is_sparse or value.device.type == "meta":
                return None
            return value.untyped_storage()
        if isinstance(value, torch.TypedStorage):
            return value.untyped_storage()
        return value if isinstance(value, torch.UntypedStorage) else None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def addresses(tensors) -> set[int]:
    """The storage addresses under `tensors` (those without storage left out)."""
    out = set()
    for t in tensors:
        s = storage_of(t)
        if s is not None and s.data_ptr():
            out.add(s.data_ptr())
    return out


class LiveTensors:
    def __init__(self):
        self.seconds = 0.0                                        # the time its mark and scans took
        self._saved: list[StorageWeakRef] = []                   # the storage of each tensor autograd saved
        self._before: dict[int, StorageWeakRef] = {}             # the storages alive at `mark()`, by identity

    def _pack(self, t):
        s = storage_of(t)
        if len(self._saved) > 4096:
            self._saved_now()
        if s is not None:
            self._saved.append(StorageWeakRef(s))
        # detached (the same storage, no grad_fn), as harness/memory.py's counter: a saved output kept with its
        # grad_fn would hold its own node alive
        return _Saved(t.detach()) if isinstance(t, torch.Tensor) else t

    @staticmethod
    def _unpack(packed):
        return packed.t if isinstance(packed, _Saved) else packed

    @contextlib.contextmanager
    def saving(self):
        """Note every tensor autograd saves for a backward while the block runs: scans count them as activations,
        as the memory lane does (harness/memory.py), even those that require no gradient (a layer norm's
        statistics, an embedding's token ids, an attention's log-sum-exp: what a backward needs)."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self

    def _saved_now(self) -> list:
        """The storage of every saved tensor that is still there; the others forgotten."""
        alive, out = [], []
        for ref in self._saved:
            storage = None if ref.expired() else torch.UntypedStorage._new_with_weak_ptr(ref.cdata)
            if storage is not None:
                alive.append(ref)
                out.append(storage)
        self._saved = alive
        return out

    def mark(self) -> None:
        """The storages alive now are not counted by later scans while they live (what the rank held before the
        case: an earlier case's or another exercise's; the ranks run one case after another). By identity, not
        by address: a storage made later at a freed one's address is new."""
        t0 = time.perf_counter()
        self._before = {s._cdata: StorageWeakRef(s) for s, _ in self._storages()}
        self.seconds += time.perf_counter() - t0

    def _storages(self) -> list:
        """(storage, in the graph) of every Python tensor and storage object alive, and every saved tensor."""
        gc.collect()                # what only garbage refers to is nobody's (a cycle through a frame, a closure)
        objects = gc.get_objects()
        kinds = _tensor_types()
        tensors = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects)))) + _frozen()
        del objects
        pairs = [(storage_of(t), isinstance(t, torch.Tensor) and (t.requires_grad or t.grad_fn is not None))
                 for t in tensors]
        saved = [(s, True) for s in self._saved_now()]
        return [(s, graph) for s, graph in pairs + saved if s is not None and s.data_ptr()]

    def _old(self, storage) -> bool:
        ref = self._before.get(storage._cdata)
        return ref is not None and not ref.expired()

    def scan(self, known: set[int] = frozenset()) -> Found:
        """The storages alive now that are neither `known` (addresses), nor the autograd graph's, nor there at
        `mark()`."""
        t0 = time.perf_counter()
        plain: dict[int, int] = {}
        graph: set[int] = set()
        for storage, in_graph in self._storages():
            ptr = storage.data_ptr()
            if in_graph:                    # (every saved tensor counts as an activation: see saving())
                graph.add(ptr)
            elif not self._old(storage):
                plain[ptr] = max(plain.get(ptr, 0), storage.nbytes())
        sizes = [b for ptr, b in plain.items() if ptr not in graph and ptr not in known]
        self.seconds += time.perf_counter() - t0
        return Found(sum(sizes), len(sizes), max(sizes, default=0))


_FROZEN: dict = {"stale": True, "refs": []}
_freeze = gc.freeze


def _noting_freeze() -> None:
    """gc.freeze, noted: the frozen tensors are listed again at the next scan."""
    _FROZEN["stale"] = True
    _freeze()


gc.freeze = _noting_freeze          # in the rank's process (the worker and an answer alike call it through here)


def _frozen() -> list:
    """The tensors and storages among the objects frozen out of the collector's way (`gc.freeze()`: the worker does
    it once the answers are loaded, harness/worker.py; an answer may do it too), which `gc.get_objects()` does not
    list: found by thawing them for as long as the listing takes, once in the process and after each freeze since
    (counting the frozen objects walks them all, 50 ms: a noted freeze instead)."""
    if _FROZEN["stale"]:
        kinds = _tensor_types()
        gc.unfreeze()
        try:
            objects = gc.get_objects()
            found = list(itertools.compress(objects, map(kinds.__contains__, map(type, objects))))
            del objects
        finally:
            _freeze()
        refs = []
        for t in found:
            s = storage_of(t)
            if s is not None:
                refs.append((weakref.ref(t), StorageWeakRef(s)) if isinstance(t, torch.Tensor) else (None,
                                                                                                   StorageWeakRef(s)))
        _FROZEN.update(stale=False, refs=refs)
    out = []
    for tensor_ref, storage_ref in _FROZEN["refs"]:
        t = tensor_ref() if tensor_ref is not None else None
        if t is not None:
            out.append(t)                       # its storage now (resized or swapped with .set_())
        elif tensor_ref is None and not storage_ref.expired():
            out.append(torch.UntypedStorage._new_with_weak_ptr(storage_ref.cdata))
    return out


class _Saved:
    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t
