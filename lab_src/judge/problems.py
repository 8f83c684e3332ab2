"""A problem found by a check, said so that a student can act on it.

Every problem names the exercise most likely at fault, the rank and the micro-batch where it showed,
and what probably went wrong:

    [q08] rank 3, micro-batch 2: the outputs match the baseline's micro-batch 1 ...

A problem may be a *consequence* of another (ranks left waiting by a rank that raised): those are
listed after the causes, and labelled (judge/failures.py makes the problems of a rank's error and orders
them, judge/summary.py says each once). This module imports no other judge: every judge imports it.

What a problem *is*, where that decides something (the credit of an item, the order problems are told
in), is its `kind`, set where it is made; the message is only what the student reads.

A judge makes problems without the exercise and the case: the caller, which knows what it is judging,
stamps them once (`stamped`). A problem that names its own exercise (a mistake of an earlier exercise)
or case (a step of a training case) keeps it.

A judge that can find the same problem twice (in the same words: its `str`) drops the repeats with
`dedupe`; telling problems of other words once, with where else they showed, is judge/summary.py's.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace



class Kind(enum.Enum):
    """What a problem is, where that decides something."""
    MISTAKE = "mistake"                 # anything not below
    WRONG_SCHEDULE = "wrong schedule"   # a valid pipeline of another declared schedule: keeps part of the credit
    WAIT = "wait"                       # says where a rank waited in an operation: told after the causes
    WHOLE_BATCH = "whole batch"         # a data-parallel rank reads the whole global batch: told first


@dataclass(frozen=True, kw_only=True)
class Problem:
    message: str = field(kw_only=False)
    exercise: str = ""        # the exercise most likely at fault (stamped by the caller when the judge leaves it)
    rank: int | None = None
    microbatch: int | None = None
    case: str = ""            # the configuration it showed in (stamped by the caller, like the exercise)
    gist: str = ""            # what it means, in the same words wherever it shows (to say it once)
    consequence: bool = False  # it follows from another problem of the same run
    kind: Kind = Kind.MISTAKE

    @property
    def where(self) -> str:
        where = []
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.microbatch is not None:
            where.append(f"micro-batch {self.microbatch}")
        return ", ".join(where)

    def __str__(self) -> str:
        head = f"[{self.exercise}]" + (f" {self.where}" if self.where else "")
        first, *rest = self.message.split("\n", 1)
        return "\n".join([f"{head}: {first}" + (f"  ({self.case})" if self.case else ""), *rest])


def stamped(problems: list[Problem], exercise: str, case: str = "") -> list[Problem]:
    """A judge's problems, each naming `exercise` and `case` unless it names its own."""
    return [replace(p, exercise=p.exercise or exercise, case=p.case or case) for p in problems]


def dedupe(problems: list[Problem]) -> list[Problem]:
    """The problems without a repeat of one already said in the same words (its `str`), in their order."""
    seen, out = set(), []
    for p in problems:
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return out


def first_wrong_steps(first: dict, later) -> list[Problem]:
    """Per rank, the problem of its first wrong step of a run of several (`first`: rank -> (step, Problem)). A rank
    whose first wrong step comes after the earliest one's is charged with a consequence instead, in the words of
    `later(step, earliest, cause)` (`cause`: the lowest rank wrong at the earliest step): an earlier step's wrong
    values reach every rank through the optimizer step."""
    if not first:
        return []
    earliest = min(k for k, _ in first.values())
    cause = min(r for r, (k, _) in first.items() if k == earliest)
    return [problem if k == earliest else Problem(later(k, earliest, cause), rank=r, consequence=True)
            for r, (k, problem) in sorted(first.items())]
