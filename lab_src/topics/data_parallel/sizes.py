"""Every message of a q19 case held against the receive it matches, before gloo sees it.

A gloo receive takes exactly the bytes its buffer holds: a message of another size aborts the receiving process
from gloo's own thread ("Received data size doesn't match expected size": exit code -6), and the check could then
only say that a rank exited. A ring whose reduce-scatter or all-gather is a chunk off sends chunk j where its
neighbour receives into chunk j + 1, and where the chunks are uneven the sizes differ. So the ring kind runs its
ranks' sends through `SizedLinks` (under comm/messages.py, as the emulated network's `Links`, network.py): each
receive, as it is posted, writes its size to the launch's store under (sender, receiver, its number from that
sender); each send waits in a thread of its rank's (one per peer, in order) until the receive it matches is
posted, then posts itself if the sizes agree, or else is never posted, and its wait raises `WrongMessageSize`
naming the two (the ring's phase and step of each, the chunk when the tensor is a view of the one summed). Every
other rank of the case then stops waiting at once (`stop`): the case ends in the time it takes to notice, its
cause said in the lab's words.

A right ring is unchanged: each send leaves as soon as its receive is posted, which a gloo send waits for anyway.
The receive's size is written when it is posted, before the rank waits, so no order of posting that works without
the check waits with it.
"""
from __future__ import annotations

import json
import queue
import threading
import time

from lab_src.topics.data_parallel.network import DelayedWork
from lab_src.topics.data_parallel.records import chunk_of, step_of


class WrongMessageSize(ValueError):
    """A send of another size than the receive it matches (held back: gloo would abort the receiving process)."""


class SizedLinks:
    """A rank's sends, each posted once the receive it matches is posted and of its size (see the module)."""

    def __init__(self, store, prefix: str, rank: int, post):
        self.store, self.prefix, self.rank, self.post = store, prefix, rank, post
        self.sent: dict[int, int] = {}          # peer -> sends to it so far
        self.taken: dict[int, int] = {}         # peer -> receives from it so far
        self.queues: dict[int, queue.SimpleQueue] = {}
        self.closed = threading.Event()
        self.failed: str | None = None          # this rank's own mismatch, once found
        self.call = None                        # (the tensor summed, n, sends and receives before the call)
        self.counts = [0, 0]                    # sends and receives posted so far
        self.asked = 0.0                        # when `stop` last asked the store

    def begin(self, tensor, n: int) -> None:
        """A call of the ring on `tensor` over n ranks begins: its messages are counted from here."""
        self.call = (tensor, n, *self.counts)

    def describe(self, tensor, is_send: bool) -> dict:
        """What a message holds, in the ring's terms: its size, which of the call's sends or receives it is, and
        where in the tensor summed its elements are, when it is a view of it."""
        flat = tensor.reshape(-1) if tensor.is_contiguous() else tensor
        info = {"elements": tensor.numel(), "bytes": tensor.numel() * tensor.element_size(), "offset": None,
                "index": None, "n": None, "length": None}
        if self.call is not None:
            whole, n, sends, recvs = self.call
            info.update(n=n, length=whole.numel(), index=self.counts[0 if is_send else 1] - (sends if is_send else recvs))
            if whole.numel() and flat.numel() and tensor.dtype == whole.dtype and \
                    tensor.untyped_storage().data_ptr() == whole.untyped_storage().data_ptr():
                offset = (tensor.data_ptr() - whole.data_ptr()) // whole.element_size()
                if 0 <= offset and offset + tensor.numel() <= whole.numel():
                    info["offset"] = offset
        self.counts[0 if is_send else 1] += 1
        return info

    def receiving(self, peer: int, tensor) -> None:
        """A receive from `peer` is being posted: its size, for the send it matches."""
        number = self.taken.get(peer, 0)
        self.taken[peer] = number + 1
        self.store.set(f"{self.prefix}/{peer}->{self.rank}/{number}", json.dumps(self.describe(tensor, False)))

    def send(self, peer: int, tensor, args: tuple, kwargs: dict) -> DelayedWork:
        number = self.sent.get(peer, 0)
        self.sent[peer] = number + 1
        work = DelayedWork()
        self._link(peer).put((number, self.describe(tensor, True), work, tensor, args, kwargs))
        return work

    def stop(self) -> str | None:
        """Why every rank of the case should stop waiting now: a send held back here or on another rank (the
        store is asked at most every 0.2 s)."""
        now = time.monotonic()
        if self.failed is None and now - self.asked >= 0.2:
            self.asked = now
            if self.store.check([f"{self.prefix}/mismatch"]):
                self.failed = "a message of the case was held back: its size is not its receive's (see that rank)"
        return self.failed

    def close(self) -> None:
        """End the links' threads (the kind calls it when its case ends): a send still waiting is never posted."""
        self.closed.set()
        for jobs in self.queues.values():
            jobs.put(None)
        self.queues.clear()

    def _link(self, peer: int) -> queue.SimpleQueue:
        if peer not in self.queues:
            self.queues[peer] = queue.SimpleQueue()
            threading.Thread(target=self._carry, args=(peer, self.queues[peer]), daemon=True,
                             name=f"lab-sized-{self.rank}-{peer}").start()
        return self.queues[peer]

    def _carry(self, peer: int, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            number, mine, work, tensor, args, kwargs = job
            key = f"{self.prefix}/{self.rank}->{peer}/{number}"
            pause = 0.0005
            # polled, never a blocking store.wait: the store's client serves one call at a time, and the rank's
            # own waits ask it (stop) whether to give up
            while not self.closed.is_set() and not self.store.check([key]):
                self.closed.wait(pause)
                pause = min(2 * pause, 0.02)
            if self.closed.is_set():
                return
            try:
                theirs = json.loads(self.store.get(key))
                if theirs["bytes"] == mine["bytes"]:
                    work._set(self.post(tensor, *args, **kwargs))
                    continue
                self.failed = mismatch(self.rank, peer, mine, theirs)
                self.store.set(f"{self.prefix}/mismatch", str(self.rank))
                work._set(error=WrongMessageSize(self.failed))
            except BaseException as e:  # noqa: BLE001 - handed to the rank's wait
                work._set(error=e)


def chunk_words(info: dict) -> str:
    """'chunk 3 of 4 (elements 2,445 to 2,607)', where the message is a view of the tensor summed; 'a buffer of
    its own' where it is not."""
    if info.get("n") is None:
        return ""
    if not info["elements"]:
        return ""           # an empty chunk: its size says it
    if info.get("offset") is None:
        return "a buffer of its own, not a view of the tensor"
    o, k, n, length = info["offset"], info["elements"], info["n"], info["length"]
    c = chunk_of(o, length, n)
    span = f"elements {o:,} to {o + k - 1:,}"
    whole = chunk_of(o + k - 1, length, n) == c and (o == 0 or chunk_of(o - 1, length, n) != c) and \
        (o + k == length or chunk_of(o + k, length, n) != c)
    return f"chunk {c} of {n} ({span})" if whole else f"{span} of the tensor"


def _where(info: dict) -> str:
    """' in the all-gather's step 2 of 3, chunk 1 of 4 (elements ...),' as far as the rank knew them."""
    said = [f"in {step_of(info['index'], info['n'])}"] if info.get("n") else []
    chunk = chunk_words(info)
    return "".join(f" {p}," for p in said + ([chunk] if chunk else []))


def mismatch(rank: int, peer: int, mine: dict, theirs: dict) -> str:
    """The held-back send, in the ring's terms."""
    return (f"its send to rank {peer},{_where(mine)} holds {mine['elements']:,} elements ({mine['bytes']:,} bytes); "
            f"the receive rank {peer} posted for it,{_where(theirs)} has room for {theirs['elements']:,} "
            f"({theirs['bytes']:,} bytes). A message and its receive must be the same size (gloo would abort the "
            f"receiving process; the lab held this one back): in each step, the chunk a rank sends is the chunk its "
            f"neighbour receives into at that step. Write down, for a rank r and a step s, which chunk it sends and "
            f"which it receives, in both halves, and check them against the figure")
