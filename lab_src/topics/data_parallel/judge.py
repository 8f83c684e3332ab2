"""Parent side of q19 (ring_all_reduce): what a run of the "ring" kind shows, from what its ranks recorded.

Two parts, each judged on every length the case summed, every rank:

    sums   each rank holds the sum of the n inputs (drawn here again from the case's seed: inputs.py), to a
           float tolerance of n additions, and every rank of a ring holds exactly the same bits. A correct
           reduce-scatter adds each chunk on one rank, in one order, and the all-gather hands that result
           round; a ring that passes whole tensors, or ranks that each add everything, add in different
           orders and differ in the last bits.
    ring   what the messages were, read from the event record (the answer's own torch.distributed calls):
           no collective; every send to the next position of the group and every receive from the previous
           one; at most 2(n - 1) sends, none larger than a chunk (ceil(length / n) elements); and what each
           send carried (its elements, first and last element and float64 sum, kept by the message recorder):
           a partial sum of some chunk over a contiguous run of the ring's positions (the reduce-scatter's; a
           run of all n: the all-gather's finished chunks), whatever the chunks' order or split. A ring of
           zeros for the record carries none.

In a hidden case (settings "perturb") the inputs are those the ranks held: changed by noise from the seed rank
0 reports (inputs.input_of). A result that is the sum of the inputs as the configuration draws them, unchanged,
was computed outside the ring (redrawn from the case's seed), and is told so.

One mistake shows on many lengths and ranks: each is said once, at the first length and rank that show it,
with where else it showed under it (`merged`). Whether the ring moved the right bytes does not depend on the
sums, and the other way round: a whole-tensor ring gets the sums right and fails the ring part alone.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.problems import Problem
from lab_src.topics.data_parallel.inputs import inputs_of
from lab_src.topics.data_parallel.records import chunk_cap, chunk_of, groups_of, ring_bytes, step_of

EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52}
COLLECTIVE_NAMES = {"all_reduce": "dist.all_reduce", "all_gather": "dist.all_gather",
                    "reduce_scatter": "dist.reduce_scatter", "broadcast": "dist.broadcast",
                    "reduce": "dist.reduce", "dist_barrier": "dist.barrier"}


def values_of(run: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(the indices, the values) a rank's record holds of its result: all of them, or the sample."""
    if run.get("whole") is not None:
        v = run["whole"]
        return torch.arange(v.numel()), v
    if run.get("sample"):
        return run["sample"][0], run["sample"][1]
    return None, None


def rings(outcome) -> list[list[int]]:
    return groups_of(outcome.case.stages, settings_of(outcome.case).columns)


def _diagnosis(got: torch.Tensor, want: torch.Tensor, mine: torch.Tensor, n: int) -> str:
    """What a wrong result looks like, from the values alone."""
    if torch.equal(got.double(), mine.double()):
        return "it is this rank's own input, unchanged"
    scale = float((got.double() * want).sum() / (want * want).sum().clamp_min(1e-300))
    close = (got.double() - scale * want).abs().max() <= 1e-4 * want.abs().max()
    if close and abs(scale - 1 / n) < 1e-6:
        return f"it is the mean, the sum divided by n = {n}: the contract asks for the sum"
    if close and abs(scale - round(scale)) < 1e-6 and round(scale) > 1:
        return f"it is {round(scale)}x the sum: some inputs were added more than once"
    return ""


REDRAWN = ("the result is the sum of the inputs as the configuration draws them, not of what the ranks held: the "
           "lab changed every rank's input, once drawn, by an amount only the run knew (its seed drawn outside the "
           "answer), so the sum was computed outside the ring, from the case's seed, and not from the values the "
           "ranks were given")


def judge_length(ring: list[int], runs: dict[int, dict], seed: int, dtype: str,
                 perturbed: int | None = None) -> dict[str, list[tuple]]:
    """The problems of one length on one ring, {"sums": [(code, Problem)], "ring": [...]}; `runs`: rank ->
    its record; `perturbed`: the seed of the change the lab made to the inputs (hidden cases). The code names
    the cause, so that one cause is said once however often it shows."""
    n = len(ring)
    found = {"sums": [], "ring": []}
    length = next(iter(runs.values()))["length"]
    xs = inputs_of(seed, length, n, dtype, perturbed)
    want, absum = sum(xs), sum(x.abs() for x in xs)
    tol = 4 * n * EPS[dtype] * absum + 1e-300
    unchanged = None
    for r, run in runs.items():
        position = ring.index(r)
        idx, got = values_of(run)
        if got is None or got.numel() != idx.numel():
            found["sums"].append(("missing", Problem("the record of its result is missing", rank=r)))
            continue
        bad = ((got.double() - want[idx]).abs() > tol[idx]).nonzero().flatten()
        if len(bad):
            i = int(idx[bad[0]])
            if perturbed is not None:
                if unchanged is None:
                    unchanged = sum(inputs_of(seed, length, n, dtype))
                if bool(((got.double() - unchanged[idx]).abs() <= tol[idx]).all()):
                    found["sums"].append(("redrawn", Problem(
                        f"{REDRAWN} (element {i} of {length:,} is {float(got[bad[0]]):.9g}, the sum of the inputs "
                        f"the ranks held is {float(want[i]):.9g})", rank=r)))
                    continue
            mine = xs[position][idx]
            why = _diagnosis(got, want[idx], mine, n)
            if run.get("returned") == "tensor" and torch.equal(got.double(), mine.double()):
                why = ("it returned another tensor and left the one it was given as it was: the contract sums in "
                       "place (a reducer reduces the gradients where they are)")
            chunks = sorted({chunk_of(int(idx[j]), length, n) for j in bad.tolist()})
            where = (f"; wrong in chunk{'s' if len(chunks) > 1 else ''} {', '.join(map(str, chunks))} of {n} "
                     f"(an even split), right in the others" if len(chunks) < min(n, length) and not why else "")
            found["sums"].append(("values", Problem(
                f"element {i} of {length:,} is {float(got[bad[0]]):.9g}, the sum of the {n} inputs is "
                f"{float(want[i]):.9g} ({len(bad)} of the {idx.numel():,} elements read are wrong"
                f"{where}){': ' + why if why else ''}", rank=r)))
    if not found["sums"]:
        digests = {r: run.get("digest") for r, run in runs.items()}
        first = ring[0]
        for r in ring[1:]:
            if r in digests and digests[r] != digests.get(first):
                found["sums"].append(("bits", Problem(
                    f"holds the sum, but not bit for bit what rank {first} holds: the ranks added the inputs in "
                    f"different orders. A reduce-scatter adds each chunk once, on one rank, and the all-gather "
                    f"hands that chunk round as it is, so every rank holds the same bits; a ring that passes the "
                    f"whole tensor, or ranks that each add all the inputs themselves, do not (and their replicas "
                    f"of a model drift apart step by step)", rank=r)))
                break
    unwaited = judge_unwaited(ring, runs)
    if unwaited:
        # the lab kept the requests, so the ring went on: without it, a neighbour would have waited for ever
        found["sums"] = [("kept", Problem(KEPT, rank=unwaited[0][1].rank, consequence=True, gist=KEPT))]
        found["ring"] = unwaited
        return found
    found["ring"] = judge_messages(ring, runs, length) + judge_carried(ring, runs, xs, dtype)
    if not found["ring"]:
        found["ring"] = judge_phases(ring, runs, xs, dtype)
    if any(code.startswith("phase") for code, _ in found["ring"]):
        # the messages of a step carried the wrong chunk: what the ranks hold after the call follows from that
        found["sums"] = [("values after a phase", replace(p, consequence=True, gist=WRONG_AFTER_PHASE))
                         if code == "values" else (code, p) for code, p in found["sums"]]
    return found


WRONG_AFTER_PHASE = "the sums a ring step's wrong chunk left"


def partial_sum_runs(n: int) -> torch.Tensor:
    """The contiguous runs of a ring's positions, as rows of 0 and 1 (n columns): every start and every length
    from 1 to n - 1 (what a reduce-scatter's messages add up), and the whole ring once (the all-gather's)."""
    rows = [[1.0 if (j - a) % n < m else 0.0 for j in range(n)] for m in range(1, n) for a in range(n)]
    return torch.tensor(rows + [[1.0] * n], dtype=torch.float64)


def chunk_offsets(length: int, n: int, k: int) -> list[int]:
    """Where a chunk of k elements can start when a tensor of `length` is cut into at most n contiguous chunks of
    at most ceil(length / n) (torch.tensor_split's, torch.chunk's, or the extra elements at the end): chunk j starts
    between length - (n - j) ceil(length / n) and j ceil(length / n)."""
    c = -(-length // n)
    return sorted({o for j in range(n) for o in range(max(0, length - (n - j) * c), min(j * c, length - k) + 1)})


def is_partial_sum(xs: list[torch.Tensor], fingerprint: list, dtype: str) -> bool:
    """Whether a message's fingerprint ([peer, elements, first, last, float64 sum]) is that of a chunk of the sum
    of the inputs of a contiguous run of positions, to n additions' float error."""
    return bool(partial_sums(xs, fingerprint, dtype))


def partial_sums(xs: list[torch.Tensor], fingerprint: list, dtype: str) -> list[tuple[int, list[int]]]:
    """Every (offset, positions) whose chunk of the positions' summed inputs has the message's fingerprint (see
    is_partial_sum): where in the tensor the message's elements are, and whose inputs they add up."""
    _, k, first, last, total = fingerprint
    n, length = len(xs), xs[0].numel()
    offsets = chunk_offsets(length, n, int(k))
    found = []
    if not offsets:
        return found
    at = torch.tensor(offsets)
    heads = torch.stack([x[at] for x in xs])
    tails = torch.stack([x[at + int(k) - 1] for x in xs])
    runs = partial_sum_runs(n)
    tol = 4 * n * EPS[dtype]
    ok = (((runs @ heads) - first).abs() <= tol * (runs @ heads.abs()) + 1e-300) & \
        (((runs @ tails) - last).abs() <= tol * (runs @ tails.abs()) + 1e-300)
    for row, col in ok.nonzero().tolist():
        o = offsets[col]
        members = [j for j in range(n) if runs[row, j] > 0]
        window = sum(float(xs[j][o:o + int(k)].sum()) for j in members)
        spread = sum(float(xs[j][o:o + int(k)].abs().sum()) for j in members)
        if abs(window - total) <= tol * spread + 1e-300:
            found.append((o, members))
    return found


def judge_carried(ring: list[int], runs: dict[int, dict], xs: list[torch.Tensor], dtype: str) -> list[tuple]:
    """The first send of each rank whose contents are no partial sum of the inputs (see is_partial_sum)."""
    n = len(ring)
    out = []
    if n == 1:
        return out
    for r, run in runs.items():
        sent = [m for m in run.get("carried") or [] if m[1]]
        for i, message in enumerate(sent):
            if is_partial_sum(xs, message, dtype):
                continue
            peer, k, first, last, total = message
            zeros = first == 0 and last == 0 and total == 0
            what = (f"{k:,} zeros" if zeros else
                    f"{k:,} elements that are no partial sum of the inputs (its first element {first:.9g})")
            out.append(("carried zeros" if zeros else "carried", Problem(
                f"{'the ring carried zeros' if zeros else 'the ring carried other values'}, not the partial sums a "
                f"ring must carry: its send {i + 1} of {len(sent)}, to rank {peer}, held {what}. A reduce-scatter "
                f"passes each chunk as the ranks before have added it (a partial sum of their inputs), the "
                f"all-gather the finished chunks; a ring of zeros sums zeros, so what this rank holds after the "
                f"call was not made by its messages", rank=r)))
            break
    return out


KEPT = ("whatever the ranks hold after the call, they hold it only because the lab kept the requests let go of: "
        "without them the ring does not finish")
UNWAITED = "a request let go of before its wait()"


def judge_unwaited(ring: list[int], runs: dict[int, dict]) -> list[tuple]:
    """Per rank, the first message whose request the answer let go of before its wait() (kind.py, comm/messages.py
    UNWAITED): gloo drops such a message, and its peer waits for ever."""
    n = len(ring)
    out = []
    for r, run in runs.items():
        for what, peer, index in (run.get("unwaited") or [])[:1]:
            call = "dist.isend" if what == "send" else "dist.irecv"
            out.append(("unwaited", Problem(
                f"its {'send to' if what == 'send' else 'receive from'} rank {peer} in {step_of(index, n)} was posted "
                f"({call}, or batch_isend_irecv) and its request let go of without wait(): gloo drops a message whose "
                f"request is gone before it completes, and "
                + (f"rank {peer}'s receive then waits for ever" if what == "send" else
                   f"rank {peer}'s send then waits for ever, this rank's buffer never filled")
                + " (here the lab kept the request, so the run went on). Keep every request and call wait() on it before "
                "the step's chunk is used and before the call returns", rank=r, gist=UNWAITED)))
    return out


PHASES = {"reduce-scatter": "a reduce-scatter step's send held a chunk summed over other inputs than that step's",
          "all-gather": "an all-gather step's send held a chunk that was not finished"}


def judge_phases(ring: list[int], runs: dict[int, dict], xs: list[torch.Tensor], dtype: str) -> list[tuple]:
    """Per rank that sent the 2(n - 1) messages of a ring, its first message whose partial sum is not its step's:
    reduce-scatter step s (from 1) sends a chunk holding s of the inputs (its own and those of the s - 1 positions
    before it, added on the way), all-gather steps a finished chunk (all n). The phase, step, chunk and the inputs
    it held, read from what the message carried (is_partial_sum, partial_sums)."""
    n, length = len(ring), xs[0].numel()
    out = []
    if n == 1:
        return out
    for r, run in runs.items():
        carried = run.get("carried") or []
        if len(carried) != 2 * (n - 1):
            continue
        for i, message in enumerate(carried):
            if not message[1]:
                continue
            matches = partial_sums(xs, message, dtype)
            phase, step = ("reduce-scatter", i + 1) if i < n - 1 else ("all-gather", i - n + 2)
            held = i + 1 if phase == "reduce-scatter" else n
            if not matches or any(len(members) == held for _, members in matches):
                continue            # no partial sum at all: judge_carried's
            offset, members = matches[0]
            k = int(message[1])
            chunk = chunk_of(offset, length, n)
            inputs = (f"the input of position {members[0]} alone" if len(members) == 1 else
                      f"the sum of {len(members)} of the {n} inputs (positions {', '.join(map(str, members))})")
            why = ("the all-gather passes finished chunks only, each the sum of all n inputs: after the reduce-scatter "
                   "a rank holds one finished chunk (the one it added to in its last step), sends it in the "
                   "all-gather's step 1, and in each later step forwards the chunk it received in the step before"
                   if phase == "all-gather" else
                   f"in the reduce-scatter's step s a rank sends the chunk it has added s - 1 received chunks to, "
                   f"the sum of s inputs (here {held}): step 1 sends a chunk of its own input, each later step the "
                   f"chunk it added the last received chunk to")
            out.append(("phase " + phase, Problem(
                f"in the {phase}, step {step} of {n - 1}, its send to rank {message[0]} carried chunk {chunk} of {n} "
                f"(elements {offset:,} to {offset + k - 1:,}) holding {inputs}: {why}", rank=r, gist=PHASES[phase])))
            break
    return out


def judge_messages(ring: list[int], runs: dict[int, dict], length: int) -> list[tuple[str, Problem]]:
    n = len(ring)
    out = []
    for r, run in runs.items():
        position = ring.index(r)
        element = 8 if run.get("dtype") == "float64" else 4
        if run.get("collectives"):
            names = sorted({COLLECTIVE_NAMES.get(k, k) for k in run["collectives"]})
            out.append(("collective", Problem(f"ring_all_reduce called {', '.join(names)}, a collective of torch.distributed: "
                               f"the exercise is to write the all-reduce itself, from point-to-point messages "
                               f"to the ring's neighbours", rank=r)))
            continue
        sends, recvs = run.get("sends") or [], run.get("recvs") or []
        if n == 1:
            if sends or recvs:
                out.append(("alone", Problem(f"a group of one rank made {len(sends) + len(recvs)} messages: it holds the sum "
                                   f"already", rank=r)))
            continue
        nxt, prev = ring[(position + 1) % n], ring[(position - 1) % n]
        wrong_to = sorted({p for p, _ in sends if p != nxt}, key=str)
        wrong_from = sorted({p for p, _ in recvs if p != prev}, key=str)
        if wrong_to or wrong_from:
            def named(peers):
                return ", ".join(f"rank {p}" + ("" if p in ring else " (outside its ring)") for p in peers)
            parts = ([f"sent to {named(wrong_to)}"] if wrong_to else []) + \
                ([f"received from {named(wrong_from)}"] if wrong_from else [])
            grid = len(ring) < max(ring) + 1
            out.append(("neighbours", Problem(
                f"at position {position} of the ring of ranks {ring} it {' and '.join(parts)}; its neighbours "
                f"are rank {nxt} (the next position: sends) and rank {prev} (the previous: receives)"
                + ("; positions are ranks of the group (dist.get_rank(group), group_dst=): global rank +- 1 is "
                   "another data-parallel column" if grid else
                   "; a ring sends to one neighbour only (a reduce to one rank, or to every rank, is not a ring)"),
                rank=r)))
            continue
        cap = chunk_cap(length, n) * element
        largest = max((b for _, b in sends), default=0)
        if largest > cap:
            out.append(("whole tensor", Problem(
                f"a message of {largest:,} bytes ({largest / (length * element):.2g}x the tensor); a chunk is at "
                f"most ceil({length:,} / {n}) = {chunk_cap(length, n):,} elements ({cap:,} bytes). A ring that "
                f"passes the whole tensor sends (n - 1) x its bytes from every rank; one that passes chunks, "
                f"2(n - 1)/n ({ring_bytes(length, n, element):,.0f} bytes here)", rank=r)))
        elif len(sends) > 2 * (n - 1):
            out.append(("too many", Problem(f"{len(sends)} sends; a ring over {n} ranks sends 2(n - 1) = {2 * (n - 1)}: n - 1 "
                               f"steps of reduce-scatter, then n - 1 of all-gather, one chunk each", rank=r)))
    return out


def merged(problems: list[tuple[str, int, Problem]]) -> list[Problem]:
    """One problem per cause (its code): the first length and rank that showed it, and where else it showed."""
    by_code: dict[str, list] = {}
    for code, length, p in problems:
        by_code.setdefault(code, []).append((length, p))
    out = []
    for group in by_code.values():
        length, first = group[0]
        lengths = sorted({n for n, _ in group[1:] if n != length})
        ranks = sorted({p.rank for _, p in group if p.rank is not None and p.rank != first.rank})
        also = []
        if ranks:
            also.append(f"also on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}")
        if lengths:
            also.append(f"also at length{'s' if len(lengths) > 1 else ''} {', '.join(f'{n:,}' for n in lengths)}")
        out.append(replace(first, message=f"{first.message} (length {length:,}{'; ' + '; '.join(also) if also else ''})"))
    return out


def judge_run(outcome) -> dict[str, list[Problem]]:
    """{"sums": [...], "ring": [...]} over every length and ring of the case, each cause once."""
    cfg = outcome.case.config
    lengths = settings_of(outcome.case).lengths
    found = {"sums": [], "ring": []}
    perturbed = None
    if settings_of(outcome.case).perturb:
        perturbed = (outcome.obs.get(0) or {}).get("perturbed")
        if not isinstance(perturbed, int):
            found["sums"].append(("no seed", lengths[0], Problem(
                "rank 0's record of the run lacks the seed of the change the lab made to every rank's input: the "
                "record was rewritten, and its sums cannot be told from sums computed outside the ring", rank=0)))
            return {part: merged(found[part]) for part in found}
    for ring in rings(outcome):
        for i, length in enumerate(lengths):
            runs = {r: (outcome.obs[r].get("runs") or [])[i] for r in ring
                    if r in outcome.obs and len(outcome.obs[r].get("runs") or []) > i}
            if len(runs) < len(ring):
                continue
            got = judge_length(ring, runs, cfg.seed, cfg.dtype, perturbed)
            for part in found:
                found[part] += [(code, length, p) for code, p in got[part]]
    judged = {part: merged(found[part]) for part in found}
    judged["ring"] += wire.byte_problems(outcome)       # what the record shows against what left each rank
    return judged


def traffic(outcome) -> list[dict]:
    """Per length: the bytes and messages each rank sent, and what a ring sends (for the check's table)."""
    rows = []
    n = len(rings(outcome)[0])
    for i, length in enumerate(settings_of(outcome.case).lengths):
        per = {r: (o.get("runs") or [])[i] for r, o in sorted(outcome.obs.items()) if len(o.get("runs") or []) > i}
        if not per:
            continue
        element = 8 if next(iter(per.values())).get("dtype") == "float64" else 4
        sent = {r: sum(b for _, b in run.get("sends") or []) for r, run in per.items()}
        rows.append({"length": length, "n": n, "sent": sent, "ideal": ring_bytes(length, n, element),
                     "messages": {r: len(run.get("sends") or []) for r, run in per.items()},
                     "largest": max((b for run in per.values() for _, b in run.get("sends") or []), default=0),
                     "seconds": max(run.get("seconds") or 0 for run in per.values())})
    return rows


# the gists of causes a ring shows in every case it reaches: said once, with the other cases under it
SENT_FIRST = "every rank of the ring sent first, with a blocking send"
POSITIONS = "a position in the group passed as a global rank"
NOT_RUN = "not run: earlier cases of the exercise stopped"
SIZES = "a send of another size than the receive it matches"


def ring_errors(outcome, qid: str, label: str) -> list[Problem]:
    """A case that did not complete, or raised on some rank, as problems (judge/failures.py), causes first;
    where every rank was left waiting in a send, the deadlock says what that means in a ring. A cause a ring
    shows in every case (the deadlock of blocking sends, a position passed as a global rank) has its gist, so
    that it is said once; a case not run because earlier ones stopped is their consequence."""
    from dataclasses import replace

    from lab_src.judge.failures import case_problems, is_wait, not_run
    from lab_src.judge.problems import stamped
    found = case_problems(outcome)
    errors = outcome.errors()
    if found and not_run(outcome):
        return stamped([replace(p, consequence=True, gist=NOT_RUN) for p in found], qid, label)
    pending = [(e.get("pending") or [None, ""])[1] or "" for e in errors.values()]
    if found and len(pending) == outcome.case.stages and all(k.startswith("send") for k in pending) and \
            all(is_wait(e) for e in errors.values()):
        found[0] = replace(found[0], gist=SENT_FIRST, message=found[0].message + (
            "\n    Every rank of the ring sent first, at the same time: a blocking send waits until its receive is "
            "posted, and each neighbour posts it only after its own send. Post each step's send and receive "
            "together (dist.batch_isend_irecv, or dist.isend, then the receive, then wait)."))
    gists = {"NotInGroup": POSITIONS, "WrongMessageSize": SIZES}
    found = [replace(p, gist=gists[errors[p.rank]["type"]]) if p.rank in errors and errors[p.rank].get("type") in gists
             else p for p in found]
    return stamped(found, qid, label)
