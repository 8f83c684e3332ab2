"""A problem found by a check, said so that a student can act on it.

Every problem names the exercise most likely at fault, the rank and the micro-batch where it showed,
and what probably went wrong:

    [q08] rank 3, micro-batch 2: the outputs match the baseline's micro-batch 1 ...
"""
from __future__ import annotations

from dataclasses import dataclass


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
        op = f"{kind}(mb={mb})" + (f" with rank {peer}" if peer is not None else "")
        if "timed out" in error["message"].lower() or "timeout" in error["message"].lower():
            msg = (f"waited in {op} until the timeout: no matching message arrived. Check that every "
                   f"send has a receive on the peer, in the same order ({error['type']})")
        else:
            msg = f"failed in {op}: {msg}"
    where = [w for w in error.get("where", []) if w[0].startswith("q")]  # the student's own files
    if where:
        file, line, fn, text = where[-1]
        msg += f"\n    at {file} line {line}, in {fn}: {text}"
    return Problem(exercise, msg, rank, error.get("pending", [None, None, None])[2] if error.get("pending") else None,
                   case)


def summary(problems: list[Problem], limit: int = 12) -> str:
    lines = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more")
    return "\n".join(lines)
