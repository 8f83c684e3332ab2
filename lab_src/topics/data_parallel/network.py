"""An emulated network under the lab's point-to-point layer: every message sent waits, before it leaves, for the
time a link would take to carry it, and now and then for much longer (a latency tail).

A CPU machine has no network between its ranks (they share its memory over loopback), and this kind of hub's
kernel has no netem to make one (`tc ... netem`: "Specified qdisc kind is unknown"). So the lab emulates the
link's time, and says "emulated" wherever a figure shows it. A message of b bytes on the link from rank s to
rank d takes

    delay = latency + b / bandwidth,  or `tail_factor` times that for a share `tail_share` of the messages,

drawn from (seed, s, d, the message's number on that link): every run of the same code meets the same slow
messages, and the sender and the judge can both say which ones they were. The wait is a sleep in a thread of
the sending rank, one per link, which posts the real send when its time is up, in the order the messages were
sent (a link is first in, first out). It uses no CPU, so a rank can compute while its message travels, as on a
real network, and a 2-core machine shows the delays honestly.

    net = Network(seed=3)
    links = Links(net, rank=0, post=original_isend)   # installed by the kind (kind_network.py) under comm/messages.py
    work = links.send(peer=1, tensor=t, args=(), kwargs={"dst": 1})
    work.wait()                                        # the message has left and been delivered

What a step should take follows from the model: P(a step meets at least one slow message) = 1 - (1 - q)^k for
k messages in the step and a share q of slow ones, which for a ring of n ranks and L layers is k = L n 2(n - 1).
"""
from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Network:
    """The emulated links: every link alike, each message's delay its own (see the module's docstring)."""
    latency: float = 1e-3            # seconds per message
    bandwidth: float = 125e6         # bytes per second (1 Gbit/s)
    tail_share: float = 0.002        # the share of messages that meet the tail
    tail_factor: float = 100.0       # how many times slower a slow message is
    seed: int = 0

    def base(self, nbytes: int) -> float:
        """A message's delay when it is not slow."""
        return self.latency + nbytes / self.bandwidth

    def slow(self, src: int, dst: int, number: int) -> bool:
        """Whether the `number`-th message on the link src -> dst meets the tail (the same in every run)."""
        return random.Random(f"{self.seed}:{src}:{dst}:{number}").random() < self.tail_share

    def delay(self, src: int, dst: int, number: int, nbytes: int) -> tuple[float, bool]:
        """(seconds the message is held, whether it is slow)."""
        slow = self.slow(src, dst, number)
        return self.base(nbytes) * (self.tail_factor if slow else 1.0), slow

    def settings(self) -> dict:
        return asdict(self)


def share_of_slow(q: float, k: int) -> float:
    """P(at least one of k messages is slow) when each is slow with probability q."""
    return 1.0 - (1.0 - q) ** k


def ring_messages(layers: int, n: int) -> int:
    """The messages of one step that all-reduces `layers` tensors in a ring of n ranks, all links together."""
    return layers * n * 2 * (n - 1)


class DelayedWork:
    """The request of a message that the link posts later: `wait()` returns when it has left and been delivered."""

    def __init__(self):
        self._posted = threading.Event()
        self._work = None
        self._error: BaseException | None = None

    def _set(self, work=None, error: BaseException | None = None) -> None:
        self._work, self._error = work, error
        self._posted.set()

    def wait(self, *args, **kwargs):
        self._posted.wait()
        if self._error is not None:
            raise self._error
        return True if self._work is None else self._work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self._posted.is_set() and (self._work is None or self._work.is_completed())


class Links:
    """A rank's outgoing links: a thread per peer that posts each message when its delay is up.

    `post(tensor, *args, **kwargs)` is the real send (gloo's isend); `sent` lists, per message, what the
    study needs: [peer, number on the link, bytes, delay, slow, the time it was handed to the link, `tag`]."""

    def __init__(self, network: Network, rank: int, post):
        self.network, self.rank, self.post = network, rank, post
        self.numbers: dict[int, int] = {}
        self.queues: dict[int, queue.SimpleQueue] = {}
        self.sent: list[list] = []
        self.tag = None                   # what the kind is doing (its step and layer), kept with each message

    def send(self, peer: int, tensor, args: tuple, kwargs: dict) -> DelayedWork:
        number = self.numbers.get(peer, 0)
        self.numbers[peer] = number + 1
        nbytes = tensor.numel() * tensor.element_size()
        delay, slow = self.network.delay(self.rank, peer, number, nbytes)
        now = time.perf_counter()
        self.sent.append([peer, number, nbytes, delay, slow, now, self.tag])
        work = DelayedWork()
        self._link(peer).put((now + delay, work, tensor, args, kwargs))
        return work

    def _link(self, peer: int) -> queue.SimpleQueue:
        if peer not in self.queues:
            self.queues[peer] = queue.SimpleQueue()
            threading.Thread(target=self._carry, args=(self.queues[peer],), daemon=True,
                             name=f"lab-link-{self.rank}-{peer}").start()
        return self.queues[peer]

    def close(self) -> None:
        """End the links' threads once what they hold is posted (the kind calls it when its case ends)."""
        for jobs in self.queues.values():
            jobs.put(None)
        self.queues.clear()

    def _carry(self, jobs: queue.SimpleQueue) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            due, work, tensor, args, kwargs = job
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                work._set(self.post(tensor, *args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the rank's wait
                work._set(error=e)
