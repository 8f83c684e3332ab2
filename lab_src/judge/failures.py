"""What went wrong in a case that did not run cleanly: the cause first, then what it caused.

When one rank raises, or waits for a message from the wrong peer, the other ranks are left waiting for
messages that never come: their timeouts (or the check stopping the run, harness/deadlock.py) are
consequences, not mistakes of their own, and point at code that is right. So a case's problems are:

1. the causes: every exception a rank raised (with the student's line), then every receive from the
   wrong peer;
2. one problem, marked as a consequence, that says where each other rank was left waiting;
3. when there is no cause to show (every rank waited for the right peer, and nobody raised), the
   waiting itself is the problem: a deadlock, with each rank's wait and the cycle, if there is one.

Every problem that says where a rank waited is a `Kind.WAIT`. The problems name no exercise or case:
the caller stamps them (judge/problems.py, `stamped`). Everything about reading a rank's error is here
(`from_error`, the student's line, a wrong peer, `sanitize`: a message without the library's paths);
judge/problems.py only holds what a problem is.
"""
from __future__ import annotations

import re

from lab_src.harness.records import gave_up_waiting
from lab_src.judge.problems import Kind, Problem
from lab_src.pipeline.schedules import Op
from lab_src.pipeline.trace import op_text, unpack

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


def is_wait(error: dict) -> bool:
    """Whether a rank's error is that it stopped waiting (a timeout, its peer gone, or the check); a
    case that was not run at all (its exercise deadlocked twice before) is not."""
    if error.get("type") == "NotRun":
        return False
    return gave_up_waiting(error.get("message", ""), error.get("type", "")) is not None


def not_run(outcome) -> bool:
    """Whether a case was not run at all because earlier cases of its exercise deadlocked, timed out or
    stopped their launch (harness/worker.py, harness/runner.py): what follows from their problems."""
    if outcome.failure:
        return f"case {outcome.case.index} not run: " in outcome.failure
    errors = outcome.errors()
    return bool(errors) and all(e.get("type") == "NotRun" for e in errors.values())


def case_problems(outcome, ring: int | None = None) -> list[Problem]:
    """A case that did not complete, or raised on some rank, as problems (empty when it ran cleanly).
    `ring`: the ranks form a ring of this many (an interleaved schedule: rank p - 1 sends to rank 0)."""
    if outcome.failure:
        return [Problem(sanitize(outcome.failure))]
    return raised_then_stuck(outcome) or rank_problems(outcome.errors(), getattr(outcome, "stuck", None), ring)


def raised_then_stuck(outcome) -> list[Problem]:
    """A case the check stopped after a rank's answer raised in a part the kind ran past (q17's and q18's
    parts: the exception is an observation, harness/observed.py `caught`): that rank went on to the case's end,
    and the ranks it left inside a collective waited for it. The exception is the cause; the deadlock is what
    it caused, said under it (never a deadlock "under an `if` on the rank" for a rank that raised)."""
    stuck = getattr(outcome, "stuck", None)
    if stuck is None:
        return []
    left = set(stuck.finished) | {m for ms in stuck.absent.values() for m in ms}
    causes = []
    for r in sorted(left & set(outcome.obs)):
        for c in outcome.obs[r].optional("caught") or []:
            line = f"\n    at {c['line']}" if c["line"] else ""
            causes.append(Problem(f"{c['what']} raised {c['type']}: {c['message']}{line}", rank=r))
    if not causes:
        return []
    return causes + [Problem("so the ranks that went on were left in a collective that the ranks above never joined, "
                             "until the check stopped the run:\n" + _indent(stuck.lines()),
                             consequence=True, kind=Kind.WAIT)]


def rank_problems(errors: dict[int, dict], stuck=None, ring: int | None = None) -> list[Problem]:
    """The errors of a case's ranks as problems: the causes, then where the others were left waiting."""
    raised, waits = {}, {}
    for r, e in sorted(errors.items()):
        (waits if is_wait(e) else raised)[r] = e
    causes = [from_error(r, e, ring) for r, e in raised.items()]
    wrong = {}
    for r, e in waits.items():
        kind, mb, peer = (e.get("pending") or [None] * 4)[1:4]
        why = wrong_peer(r, kind, peer, ring, mb) if kind else None
        if why:
            wrong[r] = e
            never = "a receive that rank {} was never going to post" if kind.startswith("send") else \
                "a message that rank {} was never going to send"
            causes.append(Problem(f"{why}; this rank waited in {kind}(mb={mb}) for {never.format(peer)}"
                                  f"{student_line(e)}", rank=r, microbatch=mb, kind=Kind.WAIT))
    left = {r: e for r, e in waits.items() if r not in wrong}
    if not causes and any(isinstance((e.get("pending") or [None] * 4)[3], list) for e in left.values()):
        # a collective that not every member joined: the watch's view of it, else each rank's own message
        return collective_deadlock(left, stuck) or [from_error(r, e, ring) for r, e in sorted(errors.items())]
    lines = _waiting_lines(left, stuck, set(raised), set(wrong), chunked=ring is not None)
    if not lines:
        # every error is accounted for above, or (ranks that only waited at the end) is one of its own
        return causes or [from_error(r, e, ring) for r, e in sorted(errors.items())]
    how = "until the check stopped the run" if stuck is not None or _stopped(left) else "until their timeout"
    if causes:
        return causes + [Problem(f"the other ranks were left waiting {how}:\n" + _indent(lines), consequence=True,
                                 kind=_wait_kind(left))]
    cycle = stuck.cycle() if stuck is not None else None
    tail = [f"they wait for each other in a cycle: {' -> '.join(f'rank {r}' for r in cycle)}"] if cycle else []
    mb = next((e["pending"][2] for e in left.values() if e.get("pending")), None)
    sends = any((e.get("pending") or [None, ""])[1].startswith("send") for e in left.values())
    more = " (or, in a send, for a receive that no rank was going to post)" if sends else ""
    return [Problem(f"deadlock: every rank waited for a message that no rank was going to send{more}, {how}. "
                    f"Check that every send has a receive on the peer, in the same order:\n" + _indent(lines + tail),
                    microbatch=mb, kind=_wait_kind(left))]


def collective_deadlock(left: dict[int, dict], stuck) -> list[Problem]:
    """The one problem of a case the check stopped while a rank waited in a collective that a member of its
    group would not join (it waited at the case's barrier, or in another collective), with the line of the
    first such rank's call; empty when the watch did not stop it so."""
    if stuck is None or not any(r in stuck.absent and r in left for r in stuck.waits):
        return []
    first = min(r for r in stuck.waits if r in stuck.absent and r in left)
    return [Problem("deadlock in a collective: a member of its group did not join it, every rank was waiting, "
                    "and the check stopped the run. Every rank of a group must call the same collectives, in "
                    "the same order (one that only some ranks reach, under an `if` on the rank, waits for "
                    "ever)." + student_line(left[first]) + "\n" + _indent(stuck.lines()),
                    rank=first, kind=Kind.WAIT)]


def _waiting_lines(left: dict[int, dict], stuck, raised: set[int], wrong: set[int], chunked: bool = False) -> list[str]:
    """One line per rank left waiting; `chunked`: the ranks hold several chunks each, so every line names one."""
    lines = []
    for r, e in sorted(left.items()):
        pending = e.get("pending")
        if pending:
            kind, mb, peer, chunk = unpack(pending)
            if isinstance(peer, list):      # a collective, over these ranks
                line = f"rank {r} waited in {kind} over ranks {peer}"
                if set(peer) & raised:
                    line += ", a member of which had stopped with the error above"
                lines.append(line)
                continue
            towards = "to" if kind.startswith("send") else "from"
            call = in_call(e, kind, mb)
            line = f"rank {r}{f', in {call},' if call else ''} waited in {op_text(kind, mb, chunk, chunked)}" + \
                (f" {towards} rank {peer}" if peer is not None else "")
            if peer in raised:
                line += ", which had stopped with the error above"
            elif peer in wrong:
                line += ", itself waiting on the wrong peer"
            elif peer in left:
                line += ", itself waiting"
            elif stuck is not None and peer in stuck.finished:
                line += f", which had done its part without {'receiving' if towards == 'to' else 'sending'} it"
            lines.append(line)
        elif stuck is not None:
            sent = [f"{k}(mb={mb})" for (src, dst), ops in sorted(stuck.unreceived.items()) if src == r
                    for k, mb in ops]
            if sent:
                dsts = sorted({dst for (src, dst), ops in stuck.unreceived.items() if src == r and ops})
                lines.append(f"rank {r} had done its part; its {', '.join(sent)} to rank "
                             f"{', '.join(map(str, dsts))} never got a matching receive")
    return lines


def in_call(error: dict, kind: str, mb) -> str:
    """'q11 send_forward_recv_backward(mb=1, recv_mb=0)': the call of q11's function the rank was in
    when it stopped (comm/messages.py), where it says more than the message it waited in (a combined
    call, or a call whose message went another way than its name)."""
    call = error.get("call")
    if not call or call == f"{kind}(mb={mb})":
        return ""
    return f"q11 {call}"


def _wait_kind(left: dict[int, dict]) -> Kind:
    """A problem that lists the ranks left waiting says where a rank waited when one waited in an operation."""
    return Kind.WAIT if any(e.get("pending") for e in left.values()) else Kind.MISTAKE


def _stopped(errors: dict[int, dict]) -> bool:
    return any(gave_up_waiting(e.get("message", ""), e.get("type", "")) == "stopped" for e in errors.values())


def _indent(lines: list[str]) -> str:
    return "\n".join("    " + line for line in lines)


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
        wrong = wrong_peer(rank, kind, peer, ring, mb)
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


def wrong_peer(rank: int, kind: str, peer, ring: int | None = None, microbatch=0) -> str | None:
    """Why `peer` is the wrong partner for `kind` on `rank`, or None if it is the right one. `ring`: the
    ranks form a ring of this many (interleaved), where rank ring - 1 and rank 0 are neighbours too. A
    message of no micro-batch is not a pipeline's (q19's ring all-reduce): no direction rule applies to it."""
    op = Op.of(kind)
    if peer is None or op is None or op.is_compute or isinstance(peer, list) or microbatch is None:
        return None
    right = rank + 1 if op.towards_next else rank - 1
    if peer == right or (ring and peer == right % ring):
        return None
    return f"wrong peer: in {kind}, {op.describe_peer(rank, rank + 2)}, not rank {peer}"

