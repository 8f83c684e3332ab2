"""Is an interleaved pipeline real, and is it Interleaved 1F1B? The checks of realness.py, per chunk.

Each rank of an interleaved case records the blocks of each of its chunks and every message with the
chunk it was sent or received for. These checks read those records against the case's schedule
(`Interleaved1F1B(v)` in pipeline/schedules.py):

- layers: the virtual stages (chunk c of rank r is virtual stage c * p + r) together own every block once,
  in order, and each rank built and ran only its chunks' pieces, once per micro-batch;
- messages: every operation talks to the peer `Op.peer` names for its chunk, the wrap-around from the
  last rank to the first included; each rank runs as many of each operation per chunk as the program;
  every send has its receive on the peer's right chunk; the ends of the model send and receive nothing;
- swapped messages: two ranks that send and receive their messages in different orders (the tensors
  then land in the wrong micro-batch or chunk, silently);
- order: at most `max_in_flight` chunk forwards waiting for their backward, and the chunks visited in the
  schedule's order. A run that breaks only the order is a valid pipeline of another schedule, and keeps
  the share of the points the exercise declares (`other_schedule_credit`).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

from lab_src.judge.problems import Kind, Problem, dedupe
from lab_src.judge.record import check_record
from lab_src.judge.realness import WRONG_SCHEDULE, check_built_and_ran, check_layers
from lab_src.pipeline.schedules import Interleaved1F1B, Op, compute_order, in_flight_violations, schedule


def _where(rank: int, chunk: int, p: int) -> str:
    return f"chunk {chunk} (virtual stage {chunk * p + rank})"


def check_chunk_layers(outcome) -> list[Problem]:
    """The virtual stages own every block once and in order; each rank built and ran only its pieces."""
    p, m = outcome.case.stages, outcome.case.microbatches
    by_virtual = {}
    for r, o in sorted(outcome.obs.items()):
        for c, ids in enumerate(o.get("chunk_layers") or []):
            by_virtual[c * p + r] = list(ids)
    problems = [replace(p_, message=p_.message.replace("this stage", f"virtual stage {p_.rank}"), rank=None)
                if p_.rank is not None else p_
                for p_ in check_layers(by_virtual, outcome.case.config.num_layers)]
    for r, o in sorted(outcome.obs.items()):
        problems += check_built_and_ran(o, r, p, m)
    return problems


def _is_wrap(op: Op, rank: int, p: int) -> bool:
    """Whether this operation's message crosses from the last rank to the first (or back)."""
    return (op.towards_next and rank == p - 1) or (not op.towards_next and rank == 0)


def _what_wraps(op: Op, rank: int, chunk: int, p: int) -> str:
    s = chunk * p + rank
    if op.towards_next:
        return (f"virtual stage {s + 1} is chunk {chunk + 1} of rank 0: the activations of the last rank's chunk "
                f"{chunk} wrap around to the first rank (and their gradients come back the same way)")
    return (f"virtual stage {s - 1} is chunk {chunk - 1} of rank {p - 1}: the first rank's chunk {chunk} gets its "
            f"input from the last rank, the wrap-around (and sends its gradient back there)")


def check_chunk_messages(events, p: int, m: int, sched: Interleaved1F1B, shape: tuple) -> list[Problem]:
    """Peers, no-ops at the ends, counts per chunk and matching, with the wrap-around named."""
    v = sched.chunks_per_rank
    problems = []
    for e in events:
        op = e.op
        if op is None or op.is_compute:
            continue
        where = f"{e.kind}(mb={e.microbatch}) of {_where(e.rank, e.chunk, p)}"
        if not 0 <= e.chunk < v:
            problems.append(Problem(f"{e.kind} recorded for chunk {e.chunk}; ranks hold chunks 0..{v - 1}",
                                    rank=e.rank, microbatch=e.microbatch))
            continue
        want = op.peer(e.rank, p, e.chunk, v)
        if want is None:
            end = "last" if op.towards_next else "first"
            problems.append(Problem(f"{where} talked to rank {e.peer}, but that chunk is the {end} virtual stage "
                                    f"of the model: it has no {'next' if op.towards_next else 'previous'} stage "
                                    f"and must not message", rank=e.rank, microbatch=e.microbatch))
        elif e.peer != want:
            why = _what_wraps(op, e.rank, e.chunk, p) if _is_wrap(op, e.rank, p) else \
                f"the {'next' if op.towards_next else 'previous'} virtual stage is on rank {want}"
            problems.append(Problem(f"{where} talked to rank {e.peer}, not rank {want}: {why}",
                                    rank=e.rank, microbatch=e.microbatch))
        if e.shape != tuple(shape):
            problems.append(Problem(f"{where} carries shape {e.shape}, not the activation shape {tuple(shape)}",
                                    rank=e.rank, microbatch=e.microbatch))
    for r in range(p):
        want = Counter((s.op, s.chunk) for s in sched.program(r, p, m))
        got = Counter((Op(e.kind), e.chunk) for e in events if e.rank == r and Op.of(e.kind) is not None)
        for op in Op:
            for c in range(v):
                n, k = want.get((op, c), 0), got.get((op, c), 0)
                if n == k:
                    continue
                where = _where(r, c, p)
                msg = f"{k} {op} operations for {where}; {m} micro-batches need {n}"
                if not op.is_compute and n and not k and _is_wrap(op, r, p):
                    msg += f": {_what_wraps(op, r, c, p)}"
                elif not op.is_compute and k and not n:
                    msg += f": {where} is the {'last' if op.towards_next else 'first'} virtual stage, which " \
                           f"{'sends' if op.is_send else 'receives'} nothing there"
                problems.append(Problem(msg, rank=r))
        for op in Op:
            for c in range(v):
                labels = Counter(e.microbatch for e in events if e.rank == r and e.kind == op.value and e.chunk == c)
                twice = sorted(mb for mb, n in labels.items() if n > 1 and mb is not None)
                if twice:
                    problems.append(Problem(f"{op} of {_where(r, c, p)} is recorded for micro-batch {twice[0]} "
                                            f"{labels[twice[0]]} times: pass each operation the micro-batch "
                                            f"and the chunk it works on", rank=r, microbatch=twice[0]))
    problems += _unmatched(events, p)
    return dedupe(_contiguous_hint(events, p, v) + problems)    # the hint explains the rest


def swapped_messages(events, p: int) -> list[Problem]:
    """Messages between two ranks are matched in the order they are posted (gloo and NCCL alike), and
    every activation has the same shape: if a rank receives them in another order than its peer sent
    them, tensors land in the wrong micro-batch or chunk without any error. The first such place of
    each pair of ranks, from the order the sends and receives were recorded in."""
    def key(e, chunk):
        return (e.phase, e.microbatch, chunk)

    problems = []
    pairs = {(e.rank, e.peer) for e in events if e.is_send} | {(e.peer, e.rank) for e in events if e.is_recv}
    for src, dst in sorted(pairs, key=str):
        sends = sorted((e for e in events if e.is_send and (e.rank, e.peer) == (src, dst)), key=lambda e: e.t_start)
        recvs = sorted((e for e in events if e.is_recv and (e.peer, e.rank) == (src, dst)), key=lambda e: e.t_start)
        if Counter(key(s, Op(s.kind).peer_chunk(src, p, s.chunk)) for s in sends) != Counter(key(r, r.chunk) for r in recvs):
            continue        # not the same messages on both sides: check_chunk_messages says which are missing
        for k, (s, r) in enumerate(zip(sends, recvs)):
            if key(s, Op(s.kind).peer_chunk(src, p, s.chunk)) != key(r, r.chunk):
                problems.append(Problem(f"{r.kind}(mb={r.microbatch}, chunk {r.chunk}) got the tensor rank {src} "
                                        f"sent with {s.kind}(mb={s.microbatch}, chunk {s.chunk}): messages from "
                                        f"rank {src} to rank {dst} are matched in the order they are posted "
                                        f"(message {k + 1} here), so the two ranks must send and receive them in "
                                        f"the same order; otherwise tensors silently land in the wrong "
                                        f"micro-batch or chunk", rank=dst, microbatch=r.microbatch))
                break
    return problems


def _unmatched(events, p: int) -> list[Problem]:
    """Every send has a receive on its peer, for the peer's chunk (the next one after a wrap-around)."""
    def key_send(e):
        return (e.rank, e.peer, e.phase, e.microbatch, Op(e.kind).peer_chunk(e.rank, p, e.chunk), e.shape)

    def key_recv(e):
        return (e.peer, e.rank, e.phase, e.microbatch, e.chunk, e.shape)

    sends = Counter(key_send(e) for e in events if e.is_send)
    recvs = Counter(key_recv(e) for e in events if e.is_recv)
    problems = []
    for key in sorted(set(sends) | set(recvs), key=str):
        src, dst, phase, mb, chunk, shp = key
        if sends[key] == recvs[key]:
            continue
        send, recv = (Op.SEND_FORWARD, Op.RECV_FORWARD) if phase == "forward" else (Op.SEND_BACKWARD, Op.RECV_BACKWARD)
        if sends[key] > recvs[key]:
            problems.append(Problem(f"{send} to rank {dst} for its chunk {chunk} has no matching {recv} "
                                    f"of chunk {chunk} on rank {dst}", rank=src, microbatch=mb))
        else:
            problems.append(Problem(f"{recv} of chunk {chunk} from rank {src} has no matching {send} on "
                                    f"rank {src}", rank=dst, microbatch=mb))
    return problems


def _contiguous_hint(events, p: int, v: int) -> list[Problem]:
    """A rank whose chunk c never sent its activations and whose chunk c + 1 never received any: the
    output of chunk c went straight into chunk c + 1, as if the rank held consecutive virtual stages."""
    problems = []
    for r in range(p):
        for c in range(v - 1):
            sent = any(e.rank == r and e.chunk == c and e.kind == "send_forward" for e in events)
            got = any(e.rank == r and e.chunk == c + 1 and e.kind == "recv_forward" for e in events)
            ran = any(e.rank == r and e.chunk == c + 1 and e.kind == "forward" for e in events)
            if ran and not sent and not got:
                problems.append(Problem(f"chunk {c} sent no activations and chunk {c + 1} received none: its "
                                        f"output seems to have gone straight into chunk {c + 1} on this rank, "
                                        f"as if rank {r} held consecutive virtual stages. Chunks are dealt out "
                                        f"round-robin: chunk {c} is virtual stage {c * p + r}, chunk {c + 1} is "
                                        f"{(c + 1) * p + r}; chunk {c}'s output goes to rank {(r + 1) % p}", rank=r))
                break
    return problems


def check_chunk_order(events, p: int, m: int, sched: Interleaved1F1B) -> list[Problem]:
    """The memory bound (a plain problem), then the order of the chunks (a valid pipeline of another
    schedule, when that is all that is wrong)."""
    held = held_too_many(events, p, m, sched)
    order = sched.order_violations(events, p, m)
    if held or not order:
        return held + [Problem(why, rank=r, microbatch=mb) for r, mb, why in order]
    r, mb, why = order[0]
    more = f" ({len(order) - 1} more place(s) like it)" if len(order) > 1 else ""
    return [Problem(f"{WRONG_SCHEDULE}: your step visits the chunks in another order than {sched.title}, "
                    f"within its memory bound (where nothing else is wrong, that is a valid interleaved schedule, "
                    f"just not this one): {why}{more}. The order decides how soon every rank has work, and so "
                    f"the bubble.", rank=r, microbatch=mb, kind=Kind.WRONG_SCHEDULE)]


def held_too_many(events, p: int, m: int, sched: Interleaved1F1B) -> list[Problem]:
    """The memory bound of `in_flight_violations`, said in chunk forwards and the warm-up that sets it."""
    found = []
    for r, mb, _ in in_flight_violations(sched, events, p, m):
        limit, warm = sched.max_in_flight(r, p, m), sched.warmup(r, p, m)
        held, worst = 0, None
        for e in compute_order(events, r):
            held += Op(e.kind).holds
            if held > limit and worst is None:
                worst = (held, e)
        held, e = worst
        found.append(Problem(f"after the forward of micro-batch {e.microbatch} on chunk {e.chunk} this rank holds "
                             f"{held} chunk forwards whose backward has not run; {sched.title} holds at most "
                             f"{limit} on rank {r} of {p}: {warm} warm-up forwards ((p - r - 1) * 2 + (v - 1) * p), "
                             f"then one forward and one backward in turn", rank=r, microbatch=e.microbatch))
    return found


def check_interleaved_run(outcome) -> list[Problem]:
    """Everything but the numbers about one interleaved case: layers, pieces, messages, order."""
    case = outcome.case
    p, m = case.stages, case.microbatches
    sched = schedule(case.schedule)
    shape = tuple(outcome.obs.get(0, {}).get("activation_shape", ()))
    events = outcome.events()
    return (check_record(outcome) + swapped_messages(events, p) + check_chunk_layers(outcome)
            + check_chunk_messages(events, p, m, sched, shape) + check_chunk_order(events, p, m, sched))


def interleaved_errors(outcome) -> list[Problem]:
    """A case that did not complete, or raised somewhere, as problems, causes first (judge/failures.py),
    with the ranks as a ring: rank p - 1 and rank 0 are neighbours, not a wrong peer."""
    from lab_src.judge.failures import case_problems
    if outcome.failure:
        return [Problem(outcome.failure)]
    p = outcome.case.stages
    problems = []
    errors = case_problems(outcome, ring=p)
    if errors:
        sched = schedule(outcome.case.schedule)
        problems += order_at_stop(outcome)
        problems += _contiguous_hint(outcome.events(), p, sched.chunks_per_rank)
    return problems + errors


def order_at_stop(outcome) -> list[Problem]:
    """For a run that stopped: where a rank had already left the schedule's order. Its forwards and
    backwards so far are compared with the program's, and a receive it was still waiting in with the
    compute that receive would feed. Usually the reason a run deadlocked."""
    case = outcome.case
    p, m = case.stages, case.microbatches
    sched = schedule(case.schedule)
    if not isinstance(sched, Interleaved1F1B):
        return []
    events = outcome.events()
    problems = [Problem(f"before the run stopped, {why}. A rank that leaves the order its peers follow ends "
                        f"up waiting for a message that is sent later or never: the pipeline deadlocks",
                        rank=r, microbatch=mb)
                for r, mb, why in sched.order_violations(events, p, m)]
    ranks = {pr.rank for pr in problems}
    for r, o in sorted(outcome.obs.items()):
        waiting = o.get("waiting")
        if r in ranks or not waiting or Op.of(waiting[0]) not in (Op.RECV_FORWARD, Op.RECV_BACKWARD):
            continue
        op, mb, chunk = Op(waiting[0]), waiting[1], waiting[2]
        compute = Op.FORWARD if op.phase == "forward" else Op.BACKWARD
        done = sum(1 for e in events if e.rank == r and e.kind == compute.value)
        order = sched.order(p, m, backward=compute is Op.BACKWARD)
        if done >= len(order) or order[done] == (mb, chunk):
            continue
        want_mb, want_c = order[done]
        rule = ("backwards visit the chunks in reverse: the gradient starts at the last virtual stage, so "
                f"chunk {sched.chunks_per_rank - 1} goes first" if compute is Op.BACKWARD else
                f"forwards take chunk 0 for a group of {p} micro-batches, then chunk 1 for the same group, ...")
        problems.append(Problem(f"the run stopped while this rank waited in {op} for micro-batch {mb} of "
                                f"chunk {chunk}, the input of its {compute} number {done + 1}; in {sched.title} "
                                f"that {compute} is micro-batch {want_mb} on chunk {want_c} ({rule}). A rank "
                                f"that waits for a message its peer sends only later deadlocks the pipeline",
                                rank=r, microbatch=mb, kind=Kind.WAIT))
    return problems


# ---- the prediction (graded: grader/hidden/q15_interleaved_step.py) -------------------------------------
PREDICTION_NAME = "predicted_interleaving"      # a function of the answer cell: numbers only (judge/numeric.py)
PREDICTION_RANKS, PREDICTION_MICROBATCHES, PREDICTION_CHUNKS = 4, 8, (1, 2, 4)


def expected_prediction(p: int = PREDICTION_RANKS, m: int = PREDICTION_MICROBATCHES,
                        chunks=PREDICTION_CHUNKS) -> dict[str, float]:
    """For each v: the idle share of a step with equal boxes, (p-1)/(v·m+p-1), and the messages one step
    sends over all ranks: each micro-batch crosses v·p-1 boundaries between virtual stages, forward and back."""
    out = {}
    for v in chunks:
        out[f"bubble_v{v}"] = (p - 1) / (v * m + p - 1)
        out[f"messages_v{v}"] = 2 * m * (v * p - 1)
    return out


def prediction_problems(got: dict) -> list[Problem]:
    """What differs between a student's prediction and the schedule's numbers (the bubble to 1 %, the
    messages exactly), each with what the count leaves out."""
    p, m = PREDICTION_RANKS, PREDICTION_MICROBATCHES
    problems = []
    for key, want in expected_prediction().items():
        v = key.rsplit("_v", 1)[1]
        if key not in got:
            problems.append(Problem(f"{PREDICTION_NAME}() gives no {key!r} entry"))
        elif key.startswith("bubble") and abs(got[key] - want) > 0.01 * want:
            problems.append(Problem(f"the predicted bubble for v = {v} is {got[key]:.4g}; with p = {p} ranks, "
                                    f"m = {m} micro-batches and equal boxes it is {want:.4g}: the ramps are p-1 "
                                    f"boxes of 1/v of a stage each, against m stages' worth of work per rank"))
        elif key.startswith("messages") and got[key] != want:
            problems.append(Problem(f"the predicted messages for v = {v} are {got[key]:g}; one step sends {want}: "
                                    f"every micro-batch crosses each boundary between consecutive virtual stages "
                                    f"once forward (its activation) and once back (its gradient)"))
    return problems
