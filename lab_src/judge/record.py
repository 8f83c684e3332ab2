"""Does a rank's record of its compute order say what the run did?

The order rules (AFAB, 1F1B's order and its memory bound, the interleaved schedules) are judged from the
events a rank returns at the end of a case. The rank also journals each operation as it begins, and the
launching process reads those lines live, as they are written (harness/case_watch.py `CaseWatch.observed`).
A rank that rewrites its events afterwards (an All-Forward-All-Backward step whose records are put into
1F1B's order once it has run) then returns an order that differs from the one read while it ran: the
record is forged, and the case fails for it, whatever the order rules say of the forged one.

A rank could also journal a false order live (drop its real compute lines, write others): the compute lines
must then sit between the rank's own message lines as a run that computes from what it receives would put
them (`out_of_step`), which, for every rank but the last, pins AFAB's messages to AFAB's compute. What this
does not catch (docs/threat-model.md): message lines forged too, consistently on every rank.
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
        lines = outcome.observed.get(r, [])
        seen = [(k, mb, c or 0) for k, mb, c, *_ in lines if _computes(k)]
        said = compute_sequence(events, r)
        if seen == said:
            problems += out_of_step(lines, r)
            continue
        at = next((i for i, (a, b) in enumerate(zip(seen, said)) if a != b), min(len(seen), len(said)))
        problems.append(Problem(
            f"this rank's recorded order differs from what the run did: its events say {_ops(said, at)}, but "
            f"as it ran (read live by the grader from its journal) it began {_ops(seen, at)}. A step is judged "
            f"on the operations it runs; rewriting the records afterwards shows as a forged record", rank=r))
    return problems


# What a compute operation needs before it and what needs it after, on one rank: a forward's input is
# received before it begins and its output sent after; a backward's likewise. (kind -> (the message
# begun before it, the message begun after it))
_BETWEEN = {"forward": ("recv_forward", "send_forward"), "backward": ("recv_backward", "send_backward")}


def out_of_step(lines: list, rank: int) -> list[Problem]:
    """Compute lines that the rank's own messages contradict, in the order the grader read them: a forward
    (backward) of micro-batch k journalled before its receive of k began, or after its send of k began. An
    honest step cannot: it computes from what it received and sends what it computed. A step that drops
    its real compute lines and journals another order contradicts its messages (judge/record.py's note).
    Judged only where each line of the rank names a distinct (kind, micro-batch) of a single chunk, so that a
    step that mislabels its messages is told that instead (realness.check_messages)."""
    keys = [(k, mb, c or 0) for k, mb, c, *_ in lines]
    if len(set(keys)) != len(keys) or any(c for _, _, c in keys):
        return []       # mislabelled messages, or model chunks (q15), whose messages name another chunk
    at = {key: i for i, key in enumerate(keys)}
    for i, (kind, mb, c) in enumerate(keys):
        if kind not in _BETWEEN:
            continue
        before, after = _BETWEEN[kind]
        if at.get((before, mb, 0), -1) > i or at.get((after, mb, 0), len(keys)) < i:
            wrong = before if at.get((before, mb, 0), -1) > i else after
            return [Problem(f"this rank's recorded order differs from what the run did: its journal, read live by "
                            f"the grader, has {Op(kind).letter}{mb} {'before' if wrong == before else 'after'} "
                            f"{wrong}(mb={mb}) began, which a run that computes from what it receives cannot "
                            f"do: the compute lines were not written as the operations ran (a forged record)",
                            rank=rank, microbatch=mb)]
    return []


def _computes(kind) -> bool:
    op = Op.of(kind)
    return op is not None and op.is_compute


def _ops(seq: list[tuple], at: int, n: int = 6) -> str:
    part = seq[at:at + n]
    if not part:
        return "nothing more" if at else "no compute at all"
    text = " ".join(f"{Op(k).letter}{mb}" + (f"c{c}" if c else "") for k, mb, c in part)
    return ("... " if at else "") + text + (" ..." if at + n < len(seq) else "")
