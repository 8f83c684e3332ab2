"""The barriers of a case, through the job's store: named, so that a rank that left the case early holds
nobody.

The ranks of a case meet twice or more: after building their stage, before the first message (a body
barrier, observe.barrier), and where each has done its part (`end`, observe.finish_messages). A rank whose
answer raised leaves the case early and meets the others at the end (worker.meet_the_others). Through
the case's process group these meetings were matched by order alone: a rank that raised while the others
built their stage met their body barrier with its end, they went on, and their own end then waited for
the group's timeout. A stub's q07 or q11 (the first and last stages call it while building) cost 15 s a
case that way, 60 s an exercise (measured: the hidden tests of a complete submission of stubs took 131 s;
10.8 s through the store).

Here each rank of a case writes one key to the launch's store per barrier it reaches ("b<k>" for its
k-th body barrier, "end" for the end) and waits, polling the store, until every other rank of the case
has written the same one or "end". A rank that has ended counts as present at every later barrier of
the case. The wait stops when the deadlock watch asks (pipeline/waiting.py) and times out like the
group (WaitTimedOut). Outside a case (no `begin`) observe.barrier falls back to the group's own barrier.
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness import own_time
from lab_src.pipeline import waiting


@dataclass
class _Case:
    store: object          # the launch's c10d store (every launch has a fresh one: harness/elastic.py)
    index: int
    rank: int
    ranks: range
    timeout_s: float
    body: int = 0          # body barriers this rank has reached
    ended: bool = False

    def key(self, rank: int, name: str) -> str:
        return f"lab-case/{self.index}/{name}/{rank}"


_current: _Case | None = None


def begin(store, index: int, rank: int, stages: int, timeout_s: float) -> None:
    """Rank `rank` takes part in case `index`, on ranks 0..stages-1."""
    global _current
    _current = _Case(store, index, rank, range(stages), timeout_s)


def finish() -> None:
    """The case is over on this rank (its end was written, or the rank is not in the next case)."""
    global _current
    _current = None


def active() -> bool:
    return _current is not None


def ranks() -> list[int]:
    """The ranks of the case now running."""
    return list(_current.ranks)


def shared(name: str, make) -> str:
    """A value the case's first rank makes (`make()`, a str) and every rank of the case reads, through the
    store: a secret of the case's own (q18's change to the embedding, pipeline/perturb.py) that no message of
    the answer's carries and no other case can read."""
    case = _current
    key = f"lab-case/{case.index}/shared/{name}"
    if case.rank == case.ranks[0]:
        case.store.set(key, make())
    else:
        waiting.until(lambda: case.store.check([key]), case.timeout_s, f"the case's {name} from rank {case.ranks[0]}",
                      own_time.peers_clock)
    return case.store.get(key).decode()


def reach() -> list[int]:
    """A body barrier: return once every other rank of the case has reached its same one, or ended; the ranks that
    had ended without reaching it (a rank whose answer raised, or one whose part was over). Every rank of the case
    that passes the barrier is told the same ranks: a rank counts as there by its barrier's key wherever it wrote
    one, and that key is written before any end of its."""
    case = _current
    name = f"b{case.body}"
    case.body += 1
    case.store.set(case.key(case.rank, name), "1")
    return _wait(case, name, f"the case's barrier after building (barrier {case.body})")


def leave() -> None:
    """Say that this rank has ended its part of the case, without waiting for the others."""
    case = _current
    if case is not None and not case.ended:
        case.store.set(case.key(case.rank, "end"), "1")
        case.ended = True


def end() -> None:
    """The end of the case: say so, and return once every rank of the case has said so."""
    leave()
    _wait(_current, "end", "the case's closing barrier")


def _wait(case: _Case, name: str, what: str) -> list[int]:
    """Wait until every other rank of the case has written `name` or ended; the ranks counted by their end alone."""
    peers = [r for r in case.ranks if r != case.rank]
    waiting_for = {r: [case.key(r, name)] + ([case.key(r, "end")] if name != "end" else []) for r in peers}
    ended: list[int] = []

    def ready() -> bool:
        for r in list(waiting_for):
            there, gone = waiting_for[r][0], waiting_for[r][1:]
            if case.store.check([there]):
                del waiting_for[r]
            elif gone and case.store.check(gone):
                if not case.store.check([there]):       # (written between the two reads: there after all)
                    ended.append(r)
                del waiting_for[r]
        return not waiting_for
    try:
        waiting.until(ready, case.timeout_s, what, own_time.peers_clock)
    except waiting.WaitTimedOut as e:
        missing = sorted(waiting_for)
        raise waiting.WaitTimedOut(f"{e}: rank{'s' if len(missing) > 1 else ''} "
                                   f"{', '.join(map(str, missing))} never reached it") from None
    return sorted(ended)
