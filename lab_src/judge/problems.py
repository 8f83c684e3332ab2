"""A problem found by a check, said so that a student can act on it.

Every problem names the exercise most likely at fault, the rank and the micro-batch where it showed,
and what probably went wrong:

    [q08] rank 3, micro-batch 2: the outputs match the baseline's micro-batch 1 ...
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.pipeline.schedules import Op


@dataclass(frozen=True)
class Problem:
    exercise: str
    message: str
    rank: int | None = None
    microbatch: int | None = None
    case: str = ""            # the configuration it showed in

    def __str__(self) -> str:
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.microbatch is not None:
            where.append(f"micro-batch {self.microbatch}")
        head = f"[{self.exercise}]" + (f" {', '.join(where)}" if where else "")
        return f"{head}: {self.message}" + (f"  ({self.case})" if self.case else "")


def from_error(exercise: str, rank: int, error: dict, case: str = "") -> Problem:
    """A problem from an exception a rank recorded, with the operation it was in and the student's line."""
    msg = f"{error['type']}: {error['message']}"
    if error.get("pending"):
        _, kind, mb, peer = error["pending"]
        if isinstance(peer, list):      # a collective, over these ranks
            op = f"{kind} over ranks {peer}"
        else:
            op = f"{kind}(mb={mb})" + (f" with rank {peer}" if peer is not None else "")
        gave_up = gave_up_waiting(error["message"])
        if gave_up and isinstance(peer, list):
            msg = (f"waited in {op} until the {'timeout' if gave_up == 'timeout' else 'others gave up'}: not every "
                   f"member joined it. Every rank of the group must call the same all-reduces in the same order "
                   f"({error['type']})")
        elif gave_up == "timeout":
            msg = (f"waited in {op} until the timeout: no matching message arrived. Check that every "
                   f"send has a receive on the peer, in the same order ({error['type']})")
        elif gave_up == "peer":
            msg = (f"waited in {op} until the peer gave up (its connection closed, after its own timeout or "
                   f"crash): no matching message arrived")
        else:
            msg = f"failed in {op}: {msg}"
        wrong = wrong_peer(rank, kind, peer)
        if wrong:
            msg += f"\n    {wrong}"
    where = [w for w in error.get("where", []) if w[0].startswith("q")]  # the student's own files
    if where:
        file, line, fn, text = where[-1]
        msg += f"\n    at {file} line {line}, in {fn}: {text}"
    return Problem(exercise, msg, rank, error.get("pending", [None, None, None])[2] if error.get("pending") else None,
                   case)


def gave_up_waiting(message: str) -> str | None:
    """"timeout" when a receive (or send) timed out, "peer" when the peer's connection closed under
    it (the peer timed out or died first), None for any other error."""
    text = message.lower()
    if "timed out" in text or "timeout" in text:
        return "timeout"
    if "closed by peer" in text or "connection reset" in text:
        return "peer"
    return None


def from_errors(exercise: str, errors: dict[int, dict], case: str = "") -> list[Problem]:
    """The exceptions of a case's ranks as problems, the most telling first: a rank talking to the
    wrong peer is usually the cause, and the others' timeouts the consequence."""
    problems = [from_error(exercise, r, e, case) for r, e in sorted(errors.items())]
    return sorted(problems, key=lambda p: "wrong peer" not in p.message)


def wrong_peer(rank: int, kind: str, peer) -> str | None:
    """Why `peer` is the wrong partner for `kind` on `rank`, or None if it is the right one."""
    op = Op.of(kind)
    if peer is None or op is None or op.is_compute:
        return None
    if peer == (rank + 1 if op.towards_next else rank - 1):
        return None
    return f"wrong peer: in {kind}, {op.describe_peer(rank, rank + 2)}, not rank {peer}"


def summary(problems: list[Problem], limit: int = 12) -> str:
    lines = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more")
    return "\n".join(lines)
