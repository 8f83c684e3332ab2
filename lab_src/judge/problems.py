"""A problem found by a check, said so that a student can act on it.

Every problem names the exercise most likely at fault, the rank and the micro-batch where it showed,
and what probably went wrong:

    [q08] rank 3, micro-batch 2: the outputs match the baseline's micro-batch 1 ...

A problem may be a *consequence* of another (ranks left waiting by a rank that raised): those are
listed after the causes, and labelled (judge/failures.py orders them, judge/summary.py says each once).

What a problem *is*, where that decides something (the credit of an item, the order problems are told
in), is its `kind`, set where it is made; the message is only what the student reads.

A judge makes problems without the exercise and the case: the caller, which knows what it is judging,
stamps them once (`stamped`). A problem that names its own exercise (a mistake of an earlier exercise)
or case (a step of a training case) keeps it.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace

from lab_src.harness.records import gave_up_waiting
from lab_src.pipeline.schedules import Op
from lab_src.pipeline.trace import op_text, unpack


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


# "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:129] " and the like
_SOURCE_REF = re.compile(r"\[[^\]\s]*[/\\][^\]\s]*:\d+\]\s*")
_LIBRARY_PATH = re.compile(r"(?:/[\w.+-]+)*/(?:site-packages|dist-packages|third_party|torch|pytorch|"
                           r"lib/python3[\w.]*)/[\w./+-]*")
# gloo's sign-off on a closed connection ("Connection closed by peer [...]. GLHF! 🏖️"): noise to a student
_GLOO_NOISE = re.compile(r"\s*GLHF!?\s*(?:\U0001F3D6\ufe0f?)?")
# a launch runs copies of the answers: <run folder>/inputs/3-q08_afab_step.py is the student's q08_afab_step.py
_ANSWER_COPY = re.compile(r"\S*/inputs/\d+-(q\d\d_\w+\.py)")


def sanitize(text: str) -> str:
    """An error message without paths into torch, gloo or the Python installation: they say where the
    library noticed a problem, never what the student should change."""
    text = _SOURCE_REF.sub("", text)
    text = _GLOO_NOISE.sub("", text)
    text = _ANSWER_COPY.sub(r"\1", text)
    return _LIBRARY_PATH.sub(lambda m: m.group(0).rsplit("/", 1)[-1], text)


def from_error(rank: int, error: dict, ring: int | None = None) -> Problem:
    """A problem from an exception a rank recorded, with the operation it was in and the student's line
    (a `Kind.WAIT` when the rank gave up waiting in it).
    `ring`: the ranks form a ring of this many (interleaved: the neighbour of rank 0 is rank ring - 1)."""
    problem_kind = Kind.MISTAKE
    msg = f"{error['type']}: {sanitize(error['message'])}" if error["type"] != "NotRun" else error["message"]
    if error.get("pending"):
        kind, mb, peer, chunk = unpack(error["pending"])
        if isinstance(peer, list):      # a collective, over these ranks
            op = f"{kind} over ranks {peer}"
        else:
            op = op_text(kind, mb, chunk, ring is not None) + (f" with rank {peer}" if peer is not None else "")
        gave_up = gave_up_waiting(error["message"], error["type"])
        if gave_up:
            problem_kind = Kind.WAIT
        if gave_up == "stopped":
            unmet = "that not every member joined" if isinstance(peer, list) else "for a message that never came"
            msg = f"waited in {op} {unmet}; every rank was waiting, so the check stopped the run"
        elif gave_up and isinstance(peer, list):
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
        wrong = wrong_peer(rank, kind, peer, ring)
        if wrong:
            msg += f"\n    {wrong}"
    elif error["type"] == "StopIteration":
        msg = exhausted(error)
    msg += student_line(error)
    return Problem(msg, rank=rank, microbatch=error["pending"][2] if error.get("pending") else None, kind=problem_kind)


def exhausted(error: dict) -> str:
    """A bare StopIteration (its message is empty): the step asked the dataloader for one micro-batch too many."""
    said = sanitize(error.get("message") or "").strip()
    return ("StopIteration" + (f": {said}" if said else "") + ": the step asked data_iter for a micro-batch after the "
            "last one, so this rank ran more forwards than num_microbatches. Count the forwards of each part of the "
            "step: in 1F1B, a warm-up of p - r - 1 forwards is more than m when there are fewer micro-batches than "
            "stages; the warm-up is min(p - r - 1, m)")


def student_line(error: dict) -> str:
    """'\n    at q07_pipeline_communicate.py line 12, in ...: <the line>' for the innermost frame of the
    answer under test (harness/worker.py names those frames by the answer's file), or ''."""
    where = [w for w in error.get("where", []) if w[0].startswith("q")]
    if not where:
        return ""
    file, line, fn, text = where[-1]
    return f"\n    at {file} line {line}, in {fn}: {text}"


def wrong_peer(rank: int, kind: str, peer, ring: int | None = None) -> str | None:
    """Why `peer` is the wrong partner for `kind` on `rank`, or None if it is the right one. `ring`: the
    ranks form a ring of this many (interleaved), where rank ring - 1 and rank 0 are neighbours too."""
    op = Op.of(kind)
    if peer is None or op is None or op.is_compute or isinstance(peer, list):
        return None
    right = rank + 1 if op.towards_next else rank - 1
    if peer == right or (ring and peer == right % ring):
        return None
    return f"wrong peer: in {kind}, {op.describe_peer(rank, rank + 2)}, not rank {peer}"

