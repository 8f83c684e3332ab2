"""Does a rank's record of its compute order say what the run did?

The order rules (AFAB, 1F1B's order and its memory bound, the interleaved schedules) are judged from the
events a rank returns at the end of a case. The rank also journals each operation as it begins, and the
launching process reads those lines live, as they are written (harness/runner.py `_CaseWatch.observed`).
A rank that rewrites its events afterwards (an All-Forward-All-Backward step whose records are put into
1F1B's order once it has run) then returns an order that differs from the one read while it ran: the
record is forged, and the case fails for it, whatever the order rules say of the forged one.

What this does not catch (docs/threat-model.md): a process that journals a false order live, as it runs,
while its messages follow the real one.
"""
from __future__ import annotations

from lab_src.judge.problems import Problem
from lab_src.pipeline.ops import Op
from lab_src.pipeline.trace import Event


def compute_sequence(events: list[Event], rank: int) -> list[tuple]:
    """(kind, micro-batch, chunk) of `rank`'s compute events in the order they began."""
    mine = sorted((e for e in events if e.rank == rank and (op := Op.of(e.kind)) is not None and op.is_compute),
                  key=lambda e: e.t_start)
    return [(e.kind, e.microbatch, e.chunk or 0) for e in mine]


def check_record(outcome) -> list[Problem]:
    """One problem per rank whose returned compute order differs from the one the grader read live."""
    if not outcome.observed:
        return []
    events = outcome.events()
    problems = []
    for r in sorted(outcome.obs):
        seen = [(k, mb, c or 0) for k, mb, c, *_ in outcome.observed.get(r, [])]
        said = compute_sequence(events, r)
        if seen == said:
            continue
        at = next((i for i, (a, b) in enumerate(zip(seen, said)) if a != b), min(len(seen), len(said)))
        problems.append(Problem(
            f"this rank's recorded order differs from what the run did: its events say {_ops(said, at)}, but "
            f"as it ran (read live by the grader from its journal) it began {_ops(seen, at)}. A step is judged "
            f"on the operations it runs; rewriting the records afterwards shows as a forged record", rank=r))
    return problems


def _ops(seq: list[tuple], at: int, n: int = 6) -> str:
    part = seq[at:at + n]
    if not part:
        return "nothing more" if at else "no compute at all"
    text = " ".join(f"{Op(k).letter}{mb}" + (f"c{c}" if c else "") for k, mb, c in part)
    return ("... " if at else "") + text + (" ..." if at + n < len(seq) else "")
