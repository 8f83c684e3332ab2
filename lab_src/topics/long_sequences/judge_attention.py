"""Parent side of q24 (ring_attention, and ulysses_attention beside it): what the ranks of an "attention" case
recorded (kind_attention.py), judged per run from behaviour, never from the answer's form:

    values     every rank's rows of the output and of dq, dk, dv, put back in sequence order (attention.py
               `unshard`), against one process's: torch's scaled_dot_product_attention with autograd, in float64,
               on the real rows (the padding dropped). A NaN anywhere is named (a block with no visible key whose
               softmax divided -inf by -inf); so are outputs that are right on the rows that see one block only and
               wrong where several are merged (partial results added without rescaling by their log-sum-exp), outputs
               that are a causal attention over the ranks' rows in the order they hold them (zigzag shards taken for
               contiguous ones), and right outputs and dq with wrong dk, dv (the keys' gradients left where they
               were computed instead of travelling home). A Ulysses run whose heads do not divide over the ranks must
               raise ValueError naming both numbers.
    messages   ring: no collective; every send to the next rank of the group, every receive from the previous one;
               the bytes each rank sent exactly 2 (N - 1) shards of K and V in the forward and (4N - 2) in the
               backward (records.py); each next block's receive posted before the rank computed on the block it
               holds (the message record's posting times against the matmuls the lab timed). Ulysses: no
               point-to-point message, four all-to-alls in the forward and four in the backward, each rank sending
               (P - 1)/P of its shard in each. The record is held against the bytes the kernel counted leaving each
               rank over the case, read from outside it (the kind is `wire`: judge/wire.py): bytes that no recorded
               message or collective carried (K and V sent around the recorder, beside dummy messages of the
               formula's sizes) fail every run's messages of the case.
    work       ring: the matmul FLOPs each rank's forward ran (the lab's count, attention.py `Work`) at most the tiles
               with a visible key (records.py `tiles`: r + 1 contiguous, 2N + 2 zigzag) and at least its visible
               scores; its backward at most 3 times that. The busiest rank over the mean follows: 2N/(N + 1)
               contiguous, 1.00 zigzag.
"""
from __future__ import annotations

import functools

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.problems import Problem
from lab_src.topics.long_sequences.attention import layout_of, pad, single, tensors, unshard
from lab_src.topics.long_sequences.records import (
    BACKWARD_FACTOR,
    WORK_SLACK,
    balance,
    expects_error,
    padded,
    positions,
    ring_backward_bytes,
    ring_forward_bytes,
    tile_flops,
    tiles,
    ulysses_bytes,
)

PARTS = ("values", "messages", "work")
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}
ELEMENT = {"float64": 8, "float32": 4, "bfloat16": 2}
NAMES = ("out", "dq", "dk", "dv")
COLLECTIVE_NAMES = {"all_reduce": "dist.all_reduce", "all_gather": "dist.all_gather",
                    "reduce_scatter": "dist.reduce_scatter", "all_to_all": "dist.all_to_all",
                    "broadcast": "dist.broadcast", "reduce": "dist.reduce", "dist_barrier": "dist.barrier"}


def run_label(run: dict) -> str:
    what = f"ring, {run['layout']}" if run["fn"] == "ring" else "Ulysses"
    return f"{what}, {'causal' if run['causal'] else 'not causal'}, S = {run['seq']}, {run['heads']} heads"


@functools.lru_cache(maxsize=32)
def _single(run_items: tuple, seed: int, index: int, batch: int, dtype: str, perturbed) -> list:
    run = dict(run_items)
    q, k, v, dout = tensors(run, seed, index, batch, dtype, perturbed)
    return single(q, k, v, dout, run["causal"])


def wanted(outcome, index: int) -> list[torch.Tensor]:
    """One process's output and gradients of run `index` (the real rows)."""
    s = settings_of(outcome.case)
    run = s.runs[index]
    return _single(tuple(sorted(run.items())), outcome.case.config.seed, index, s.batch, s.dtype, perturbed_of(outcome))


def perturbed_of(outcome):
    if not getattr(settings_of(outcome.case), "perturb", False):
        return None
    return (outcome.obs.get(0) or {}).get("perturbed")


def gathered(outcome, index: int, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """Every rank's rows of `name` ("out", "dq", ...), in sequence order, the padding dropped."""
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    layout = layout_of(run)
    shards = {r: (runs_of(o)[index] if len(runs_of(o)) > index else {}).get(name) for r, o in outcome.obs.items()}
    whole = unshard(shards, n, layout, pad(like, n, layout))
    return None if whole is None else whole[..., :run["seq"], :]


def runs_of(o) -> list:
    return o.get("runs") or []


def close(got, want, dtype: str) -> bool:
    return got is not None and bool(((got.double() - want.double()).abs().max() <=
                                     TOLERANCE.get(dtype, 1e-4) * max(1.0, float(want.double().abs().max()))))


def rows_right(got: torch.Tensor, want: torch.Tensor, dtype: str) -> torch.Tensor:
    """Per real row (position), whether every head and element of it is right."""
    tol = TOLERANCE.get(dtype, 1e-4) * max(1.0, float(want.double().abs().max()))
    return ((got.double() - want.double()).abs() <= tol).all(-1).all(1).all(0)


def sources_seen(run: dict, n: int) -> list[int]:
    """Per real row, how many ranks' key blocks hold a key it sees."""
    layout = layout_of(run)
    rows = padded(run["seq"], n, layout) // n
    owner = {}
    for r in range(n):
        for p in positions(r, n, rows, layout):
            owner[p] = r
    seen = []
    for p in range(run["seq"]):
        keys = range(p + 1) if run["causal"] else range(run["seq"])
        seen.append(len({owner[k] for k in keys}))
    return seen


def as_contiguous(outcome, index: int) -> torch.Tensor:
    """What a causal ring that took every rank's rows for a contiguous shard computes: causal attention over the
    sequence in the order the ranks hold it (rank 0's rows, then rank 1's, ...), put back in sequence order."""
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    q, k, v, dout = (pad(t, n, "zigzag") for t in
                     tensors(run, outcome.case.config.seed, index, s.batch, s.dtype, perturbed_of(outcome)))
    rows = q.shape[-2] // n
    order = [p for r in range(n) for p in positions(r, n, rows, "zigzag")]
    out = single(q[..., order, :], k[..., order, :], v[..., order, :], dout[..., order, :], True)[0]
    back = torch.empty_like(out)
    back[..., order, :] = out
    return back[..., :run["seq"], :]


def head_shards_kept(outcome, index: int) -> bool:
    """Whether every rank's output is its H/P heads over the whole (padded) sequence, reshaped to its shard's shape:
    Ulysses without the reverse all-to-all."""
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    q, k, v, dout = (pad(t, n, "contiguous") for t in
                     tensors(run, outcome.case.config.seed, index, s.batch, s.dtype, perturbed_of(outcome)))
    whole = single(q, k, v, dout, run["causal"])[0]
    heads = run["heads"] // n
    for r, o in outcome.obs.items():
        got = (runs_of(o)[index] if len(runs_of(o)) > index else {}).get("out")
        mine = whole[:, r * heads:(r + 1) * heads].reshape(q.shape[0], q.shape[1], q.shape[2] // n, q.shape[3])
        if got is None or tuple(got.shape) != tuple(mine.shape) or not close(got, mine, s.dtype):
            return False
    return True


def raised_problem(rec: dict, run: dict) -> Problem:
    raised = rec["raised"]
    line = f" at {raised['line']}" if raised.get("line") else ""
    who = "ring_attention" if run["fn"] == "ring" else "ulysses_attention"
    return Problem(f"{who} raised {raised['type']}{line}: {raised['message']}",
                   gist=f"{who} raised {raised['type']}: {raised['message'][:120]}")


def value_problems(outcome, index: int) -> list[Problem]:
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    recs = {r: (runs_of(o)[index] if len(runs_of(o)) > index else None) for r, o in sorted(outcome.obs.items())}
    if expects_error(run, n):
        return ulysses_refusal(recs, run, n)
    for r, rec in recs.items():
        if rec is None:
            return [Problem("the rank recorded nothing of this run", rank=r)]
        if rec.get("raised"):
            return [replace_rank(raised_problem(rec, run), r)]
        if rec.get("returned"):
            who = "ring_attention" if run["fn"] == "ring" else "ulysses_attention"
            return [Problem(f"{who} returned {rec['returned']}", rank=r)]
    want = wanted(outcome, index)
    got = {name: gathered(outcome, index, name, want[i]) for i, name in enumerate(NAMES)}
    missing = [name for name in NAMES[1:] if got[name] is None]
    if got["out"] is None:
        return [Problem("the output's shards could not be put together (a rank's output has another shape)")]
    nan = [name for name in NAMES if got[name] is not None and not torch.isfinite(got[name]).all()]
    if nan:
        said = nan[0] if len(nan) == 1 else f"{', '.join(nan[:-1])} and {nan[-1]}"
        return [Problem(
            f"{said} hold{'s' if len(nan) == 1 else ''} NaN or inf: a block in which some query sees no "
            f"key (every score -inf under the causal mask) gave exp(-inf - (-inf)) = NaN, which every merge after it "
            f"spreads. A block with no visible key for a row gives that row output 0 and log-sum-exp -inf, and the "
            f"merge must take a -inf log-sum-exp as weight 0 (or skip blocks no query of the rank can see)",
            gist="NaN from a block with no visible key")]
    if missing:
        return [Problem(f"no gradient reached {', '.join(missing)}: the output must be computed from q, k and v "
                        f"through autograd (an autograd.Function's backward returns a gradient for each)")]
    right = {name: close(got[name], want[i], s.dtype) for i, name in enumerate(NAMES)}
    if all(right.values()):
        return []
    dtype = s.dtype
    if not right["out"]:
        if run["fn"] == "ring" and run["causal"] and layout_of(run) == "zigzag" and \
                close(got["out"], as_contiguous(outcome, index), dtype):
            return [Problem("the outputs are a causal attention over the rows in the order the ranks hold them, as if "
                            "rank r held chunk r alone: with the zigzag layout rank r holds chunks r and 2N - 1 - r, so "
                            "the causal mask between a query and a key must compare their global positions (rank r's "
                            "first half at r*c, its second at (2N - 1 - r)*c, c = rows / 2)",
                            gist="zigzag shards masked as contiguous ones")]
        if run["fn"] == "ulysses" and head_shards_kept(outcome, index):
            return [Problem("each rank's output holds its H/P heads over the whole sequence, reshaped to its shard's "
                            "shape: the reverse all-to-all is missing. After the attention per head, the output goes "
                            "back from head shards to sequence shards (every head of this rank's rows) by a second "
                            "all-to-all, and its backward is the first one's reverse",
                            gist="Ulysses without the reverse all-to-all")]
        ok = rows_right(got["out"], want[0], dtype)
        seen = sources_seen(run, n)
        one = [i for i, k in enumerate(seen) if k == 1]
        many = [i for i, k in enumerate(seen) if k > 1]
        if run["fn"] == "ring" and one and many and all(bool(ok[i]) for i in one) and not any(bool(ok[i]) for i in many):
            return [Problem(
                "the rows whose keys all sit in one rank's block are right, and every row that sees several blocks "
                "is wrong: the partial results were merged without rescaling. Each block's output is normalised by its "
                "own softmax sum; two of them combine as out = out1 * exp(lse1 - lse) + out2 * exp(lse2 - lse) with "
                "lse = logaddexp(lse1, lse2), the log-sum-exp of all the scores seen so far",
                gist="partials merged without log-sum-exp rescaling")]
        bad = [i for i in range(run["seq"]) if not bool(ok[i])]
        return [Problem(f"the output differs from one process's scaled_dot_product_attention at {len(bad)} of "
                        f"{run['seq']} positions (the first: {bad[0] if bad else '-'})",
                        gist="outputs differ from one process's")]
    if not (right["dk"] and right["dv"]) and right["dq"]:
        return [Problem(
            "the output and dq are right, dk and dv are not: a key's gradient is a sum over every rank whose queries "
            "saw it, so dK and dV of each block must travel round the ring with it, each rank adding its part, and "
            "arrive home at the rank that holds the block" if run["fn"] == "ring" else
            "the output and dq are right, dk and dv are not: each all-to-all's backward is the reverse all-to-all",
            gist="dK and dV not brought home")]
    wrong = [name for name in NAMES if not right[name]]
    return [Problem(f"the output is right but {', '.join(wrong)} differ from one process's gradients (autograd "
                    f"through scaled_dot_product_attention)")]


def replace_rank(p: Problem, rank: int) -> Problem:
    from dataclasses import replace
    return replace(p, rank=rank)


def ulysses_refusal(recs: dict, run: dict, n: int) -> list[Problem]:
    heads = run["heads"]
    for r, rec in recs.items():
        raised = (rec or {}).get("raised")
        if not raised:
            return [Problem(f"ulysses_attention on P = {n} ranks with {heads} heads returned: Ulysses deals out whole "
                            f"heads, so it must raise ValueError when the heads do not divide over the ranks "
                            f"(P > heads, or heads % P != 0)", rank=r)]
        if raised["type"] != "ValueError" or str(n) not in raised["message"] or str(heads) not in raised["message"]:
            return [Problem(f"ulysses_attention on P = {n} ranks with {heads} heads raised {raised['type']}: "
                            f"{raised['message'][:200]}; the contract asks for a ValueError whose message names P = {n} "
                            f"and the {heads} heads", rank=r)]
    return []


def message_problems(outcome, index: int) -> list[Problem]:
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    if expects_error(run, n):
        return []
    element = ELEMENT[s.dtype]
    out = []
    for r, o in sorted(outcome.obs.items()):
        rec = runs_of(o)[index] if len(runs_of(o)) > index else None
        if not rec or rec.get("raised") or "forward" not in rec:
            out.append(Problem("no messages to judge: the run did not complete on this rank", rank=r, consequence=True,
                               gist="no messages: the run did not complete"))
            continue
        fwd, bwd = rec["forward"], rec.get("backward") or {"sends": [], "recvs": [], "collectives": [], "matmuls": []}
        if run["fn"] == "ring":
            out += ring_messages(r, n, run, fwd, bwd, element, s.batch)
        else:
            out += ulysses_messages(r, n, run, fwd, bwd, element, s.batch)
    return out[:4]


def ring_messages(r: int, n: int, run: dict, fwd: dict, bwd: dict, element: int, batch: int) -> list[Problem]:
    colls = sorted({COLLECTIVE_NAMES.get(c[0], c[0]) for c in fwd["collectives"] + bwd["collectives"]})
    if colls:
        return [Problem(f"ring_attention called {', '.join(colls)}: a ring passes K and V (and in the backward dK "
                        f"and dV) to the next rank with point-to-point messages", rank=r)]
    nxt, prev = (r + 1) % n, (r - 1) % n
    problems = []
    for what, ph in (("forward", fwd), ("backward", bwd)):
        to = sorted({m[0] for m in ph["sends"] if m[0] != nxt}, key=str)
        frm = sorted({m[0] for m in ph["recvs"] if m[0] != prev}, key=str)
        if to or frm:
            parts = ([f"sent to rank {', '.join(map(str, to))}"] if to else []) + \
                ([f"received from rank {', '.join(map(str, frm))}"] if frm else [])
            return [Problem(f"in the {what} it {' and '.join(parts)}; in a ring rank {r} sends to the next rank, {nxt}, "
                            f"and receives from the previous, {prev}, only: the block it holds goes on to the rank "
                            f"that has not seen it yet", rank=r, gist="a message to another rank than the ring's neighbour")]
    sent_f, sent_b = sum(m[1] for m in fwd["sends"]), sum(m[1] for m in bwd["sends"])
    want_f, want_b = ring_forward_bytes(run, n, element, batch), ring_backward_bytes(run, n, element, batch)
    shard = want_f // (2 * (n - 1)) if n > 1 else 0
    if sent_f != want_f:
        problems.append(Problem(
            f"the forward sent {sent_f:,} B; a ring sends K and V on N - 1 = {n - 1} times, 2 (N - 1) shards of "
            f"{shard:,} B = {want_f:,} B"
            + (": every block went round to every rank (the last step's send is one too many)"
               if n > 1 and sent_f == 2 * n * shard else ""), rank=r))
    if sent_b != want_b:
        said = (f"the backward sent {sent_b:,} B; a ring's backward sends K and V on again (2 (N - 1) shards) and dK, dV "
                f"round all N ranks home (2N shards): (4N - 2) x {shard:,} B = {want_b:,} B")
        if n > 1 and sent_b == 2 * (n - 1) * shard:
            said += ": no gradient travelled, only K and V. dK and dV of a block must go round with it and come home"
        problems.append(Problem(said, rank=r, gist="backward bytes" if sent_b != 2 * (n - 1) * shard else
                                "the backward sent no dK, dV"))
    late = late_receive(fwd)
    if late is not None:
        problems.append(Problem(
            f"in the forward, the receive of block {late + 1} was posted after the rank had computed on block {late}: "
            f"post the next block's receive (and the send of the one held) before computing on the block held, so "
            f"that the message travels while the rank computes", rank=r, gist="receive posted after computing"))
    return problems


def late_receive(phase: dict) -> int | None:
    """The first step whose next block's receive was posted after a matmul on the block held (None: none)."""
    recvs = sorted(phase["recvs"], key=lambda m: m[2])
    matmuls = [m[0] for m in phase["matmuls"]]
    held_since = float("-inf")          # when the rank began to hold the block of this step
    for step, recv in enumerate(recvs):
        # a matmul on the block held (after it arrived) before the next block's receive was posted
        if any(held_since <= t < recv[2] for t in matmuls):
            return step
        held_since = recv[3]
    return None


def ulysses_messages(r: int, n: int, run: dict, fwd: dict, bwd: dict, element: int, batch: int) -> list[Problem]:
    if fwd["sends"] or fwd["recvs"] or bwd["sends"] or bwd["recvs"]:
        return [Problem("ulysses_attention sent point-to-point messages: Ulysses moves its shards with all-to-alls "
                        "(dist.all_to_all_single)", rank=r)]
    problems = []
    for what, ph in (("forward", fwd), ("backward", bwd)):
        kinds = [c[0] for c in ph["collectives"]]
        others = sorted({COLLECTIVE_NAMES.get(k, k) for k in kinds if k != "all_to_all"})
        a2a = [c for c in ph["collectives"] if c[0] == "all_to_all"]
        if others:
            problems.append(Problem(f"the {what} called {', '.join(others)}: Ulysses needs all-to-alls only", rank=r))
        elif len(a2a) != 4:
            why = ("q, k and v go from sequence shards to head shards (three), and the output comes back (the reverse: "
                   "head shards to sequence shards)")
            if len(a2a) == 3:
                why += (": the reverse all-to-all is missing, so the rank's output holds its heads over the whole "
                        "sequence, not every head of its rows" if what == "forward" else
                        ": one of the four gradients did not go back by the reverse all-to-all")
            problems.append(Problem(f"the {what} made {len(a2a)} all-to-all{'s' if len(a2a) != 1 else ''}; Ulysses "
                                    f"makes four: {why}", rank=r,
                                    gist=f"Ulysses' {what} without four all-to-alls"))
        else:
            sent = sum(c[1] for c in a2a) * (n - 1) / n
            want = ulysses_bytes(run, n, element, batch)
            if abs(sent - want) > 0.5:
                problems.append(Problem(f"the {what}'s all-to-alls sent {sent:,.0f} B from this rank; four of its "
                                        f"shard's (P - 1)/P are {want:,.0f} B", rank=r))
    return problems


def work_problems(outcome, index: int) -> list[Problem]:
    s = settings_of(outcome.case)
    run, n = s.runs[index], outcome.case.stages
    if run["fn"] != "ring":
        return []
    layout, causal = run["layout"], run["causal"]
    tile = tile_flops(run, n, s.batch)
    rows = padded(run["seq"], n, layout) // n
    problems = []
    work = work_of(outcome, index)
    if len(work) < n:
        return [Problem("no work to judge: the run did not complete on every rank", consequence=True,
                        gist="no work: the run did not complete")]
    for r in range(n):
        fwd, bwd = work[r]
        bound = tiles(r, n, layout, causal) * tile
        qpos = positions(r, n, rows, layout)
        pairs = sum(p + 1 for p in qpos) if causal else rows * n * rows      # the scores its queries see
        least = 4 * s.batch * run["heads"] * run["dim"] * pairs
        if fwd > bound * (1 + WORK_SLACK):
            every = (n if layout == "contiguous" else 4 * n) * tile
            said = (f"its forward ran {fwd:,} matmul FLOPs, {fwd / tile:.1f} tiles of one chunk of queries by one of "
                    f"keys; the tiles in which its queries see a key are {tiles(r, n, layout, causal)} ({bound:,} FLOPs)")
            if causal and abs(fwd - every) <= WORK_SLACK * every:
                said += (": it computed every block, also those in which every key comes after every query (all "
                         "masked). Skip them" + (": with zigzag shards, of a block from an earlier rank only its first "
                                                 "chunk is seen, and only this rank's second chunk sees a later "
                                                 "rank's block" if layout == "zigzag" else ""))
            problems.append(Problem(said, rank=r, gist="blocks with no visible key computed"))
        elif fwd < least:
            problems.append(Problem(f"its forward ran {fwd:,} matmul FLOPs, fewer than the {pairs:,} scores its "
                                    f"queries see need ({least:,}): it skipped blocks in which some of its queries see "
                                    f"a key (or made scores without a matmul: the lab counts torch.matmul, @, bmm, "
                                    f"einsum)", rank=r, gist="visible blocks skipped"))
        if bwd > BACKWARD_FACTOR * bound * (1 + WORK_SLACK):
            problems.append(Problem(f"its backward ran {bwd:,} matmul FLOPs, more than {BACKWARD_FACTOR:g} times its "
                                    f"forward's tiles ({bound:,}): the backward computes blocks with no visible key "
                                    f"too", rank=r, gist="backward blocks with no visible key computed"))
    if not problems:
        fwd = [w[0] for w in work.values()]
        measured = max(fwd) * n / max(1, sum(fwd))
        if layout == "zigzag" and causal and measured > balance(n, layout, causal) + 0.05:
            problems.append(Problem(f"the busiest rank computed {measured:.2f} times the mean; zigzag shards give "
                                    f"every rank the same work (1.00)"))
    return problems


def work_of(outcome, index: int) -> dict[int, tuple[int, int]]:
    """rank -> (forward FLOPs, backward FLOPs) the lab counted in run `index`."""
    out = {}
    for r, o in outcome.obs.items():
        rec = runs_of(o)[index] if len(runs_of(o)) > index else None
        if rec and "forward" in rec and "backward" in rec:
            out[r] = (sum(m[2] for m in rec["forward"]["matmuls"]), sum(m[2] for m in rec["backward"]["matmuls"]))
    return out


def judge_run(outcome) -> dict[str, dict[str, list[Problem]]]:
    """{part: {run label: [Problem]}} over the case's runs."""
    s = settings_of(outcome.case)
    found = {p: {} for p in PARTS}
    on_wire = wire.byte_problems(outcome)       # the case's: the kernel counts its runs' bytes together
    for index, run in enumerate(s.runs):
        label = run_label(run)
        found["values"][label] = value_problems(outcome, index)
        found["messages"][label] = message_problems(outcome, index) + on_wire
        if run["fn"] == "ring":
            found["work"][label] = work_problems(outcome, index)
    return found


def flat(found: dict) -> list[Problem]:
    return [p for part in found.values() for problems in part.values() for p in problems]


def traffic(outcome) -> list[dict]:
    """Per run: the bytes each rank sent in the forward and the backward, the formulas', and each rank's forward work
    (for the check's table and the figure)."""
    s = settings_of(outcome.case)
    n, element = outcome.case.stages, ELEMENT[s.dtype]
    rows = []
    for index, run in enumerate(s.runs):
        if expects_error(run, n):
            continue
        per = {r: runs_of(o)[index] for r, o in sorted(outcome.obs.items())
               if len(runs_of(o)) > index and "forward" in runs_of(o)[index]}
        if not per:
            continue

        def sent(rec, ph, run=run, n=n):
            p = rec.get(ph) or {}
            if run["fn"] == "ring":
                return sum(m[1] for m in p.get("sends") or [])
            return sum(c[1] for c in p.get("collectives") or [] if c[0] == "all_to_all") * (n - 1) / n
        want_f = ring_forward_bytes(run, n, element, s.batch) if run["fn"] == "ring" else \
            ulysses_bytes(run, n, element, s.batch)
        want_b = ring_backward_bytes(run, n, element, s.batch) if run["fn"] == "ring" else want_f
        work = {r: sum(m[2] for m in rec["forward"]["matmuls"]) for r, rec in per.items()}
        total = sum(work.values())
        rows.append({"label": run_label(run), "run": run, "forward": {r: sent(rec, "forward") for r, rec in per.items()},
                     "backward": {r: sent(rec, "backward") for r, rec in per.items()},
                     "want_forward": want_f, "want_backward": want_b, "work": work,
                     "balance": max(work.values()) * len(work) / total if total else None,
                     "want_balance": balance(n, run["layout"], run["causal"]) if run["fn"] == "ring" else None,
                     "messages": {r: len((rec.get("forward") or {}).get("sends") or []) +
                                  len((rec.get("forward") or {}).get("collectives") or []) for r, rec in per.items()}})
    return rows
