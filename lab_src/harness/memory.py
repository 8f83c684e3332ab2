"""Activation memory of a step, counted while it runs: bytes of tensors autograd saved for backward.

    with counting(stage, tracer):            # every event the tracer records carries `held`
        step(stage, data_iter, m)

Inside `counting`, `torch.autograd.graph.saved_tensors_hooks` sees every tensor a forward saves for
its backward. Each storage is counted once (views share it), the stage's own parameters not at all
(they are memory of the model, not of a micro-batch in flight). A saved tensor stops counting when
autograd drops it: after the backward that used it, or when its graph is freed. What a rank holds is
therefore the activations of the micro-batches whose backward has not run yet: m of them in
All-Forward-All-Backward, at most p - r in One-Forward-One-Backward.
"""
from __future__ import annotations

import contextlib
import resource

import torch


class SavedBytes:
    """Live bytes of saved tensors, by storage."""

    def __init__(self, exclude=()):
        self.exclude = set(exclude)            # storage addresses not to count (parameters)
        self.storages: dict[int, list] = {}    # address -> [bytes, references]
        self.now = 0
        self.peak = 0

    def pack(self, t: torch.Tensor):
        try:
            storage = t.untyped_storage()
            key = storage.data_ptr()
        except Exception:  # noqa: BLE001 - tensors without storage (sparse, meta) are not counted
            return t
        if key in self.exclude or key == 0:
            return t
        entry = self.storages.get(key)
        if entry is None:
            entry = self.storages[key] = [storage.nbytes(), 0]
            self.now += entry[0]
            self.peak = max(self.peak, self.now)
        entry[1] += 1
        # detached (the same storage, no grad_fn): a saved output kept with its grad_fn would hold its own
        # node alive (node -> saved -> tensor -> grad_fn -> node), which autograd only breaks by running that
        # node without retain_graph; a split backward (q16) runs some nodes once with retain_graph=True
        return _Held(t.detach(), key, self)

    @staticmethod
    def unpack(h):
        return h.t if isinstance(h, _Held) else h

    def release(self, key: int) -> None:
        entry = self.storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.now -= entry[0]
            del self.storages[key]


class _Held:
    __slots__ = ("t", "key", "counter")

    def __init__(self, t, key, counter):
        self.t, self.key, self.counter = t, key, counter

    def __del__(self):
        self.counter.release(self.key)


@contextlib.contextmanager
def counting(stage, tracer=None):
    """Count saved-for-backward bytes while the block runs; the tracer's events carry the count."""
    params = {p.untyped_storage().data_ptr() for p in stage.parameters()}
    counter = SavedBytes(params)
    if tracer is not None:
        tracer.memory = lambda: counter.now
    try:
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
            yield counter
    finally:
        if tracer is not None:
            tracer.memory = None


def peak_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
