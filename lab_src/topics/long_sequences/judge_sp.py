"""Parent side of q23's third answer, `sp_block` (kind "sp_block", kind_sp.py): judged from what each rank did,
never from the answer's form. One process's block of the case's configuration is run here, on the whole sequence,
with its masks drawn as pipeline/dropout.py defines them for t shards; rank r should hold its sequence shard of it.

    values       (float64 cases) the output and the input's gradient on the rank's positions, and the gradients of
                 what it holds (qkv by heads, proj by its heads' columns, up by rows, down by columns) against one
                 process's, dropout off and on; a wrong one read for its cause (right without dropout, wrong with
                 it: the residual masks are not the shard's slice of one process's)
    replicated   the gradients of what every rank holds whole and uses on its own positions (the LayerNorms, proj's
                 and down's biases: records.SP_REPLICATED) equal one process's on every rank: summed over the group.
                 A rank whose gradient is its shard's part only is named, rank and parameter. Where the values are
                 wrong (their cause named there), only that the ranks' gradients agree
    memory       (dropout on) the bytes the forward saved on each rank are the closed form records.sp_kept_bytes, within
                 SLACK; the column-parallel layers' gathered input kept is named by its bytes
    traffic      per rank the all-gathers and reduce-scatters of records.sp_traffic, each of its bytes; no all-reduce
                 beyond the replicated gradients' (an all-reduce of the activation is tensor parallelism's, not this);
                 2 all-gathers in the backward, not 4, only where the rank's forward kept the gathered inputs (the
                 memory part names that, and it is not counted twice)

`judge_sp(outcome)` returns {part: [Problem]} (a part not judged in the case: absent).
"""
from __future__ import annotations

import functools

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.pipeline.model import build_piece
from lab_src.topics.long_sequences.records import (
    SLACK,
    SP_DROPOUT,
    SP_NORM_BYTES,
    SP_REPLICATED,
    sp_gathered_extra,
    sp_kept_bytes,
    sp_traffic,
    tp_kept_bytes,
)
from lab_src.topics.long_sequences import shards as tpmod
from lab_src.topics.long_sequences.shards import block_config

SP_JUDGED = ("values", "replicated", "memory", "traffic")
WHO = "sp_block"
TOLERANCE = 1e-10
WHAT = {"block": "dropout off", "dropout": f"dropout {SP_DROPOUT}"}


@functools.lru_cache(maxsize=16)
def _full(part: str, cfg, t: int) -> dict:
    block = build_piece(block_config(cfg, t, SP_DROPOUT if part == "dropout" else 0.0), tpmod.BLOCK).train()
    data = tpmod.block_inputs(cfg)
    x = data["x"].clone().requires_grad_()
    y = block(x)
    y.backward(data["grad"])
    return {"out": y.detach(), "in_grad": x.grad.detach(),
            "grads": {n: q.grad.detach().clone() for n, q in block.named_parameters()}}


def expected(part: str, cfg, t: int, r: int) -> dict:
    """What rank r of t should hold: its positions of the output and input gradient, its shards' gradients."""
    f = _full(part, cfg, t)
    g, h, heads = f["grads"], cfg.hidden_size, cfg.num_heads
    rows = tpmod.heads_rows(h, heads, r, t)
    return {"out": f["out"].chunk(t, 1)[r], "in_grad": f["in_grad"].chunk(t, 1)[r],
            "grads": {"qkv.weight": g["qkv.weight"][rows], "qkv.bias": g["qkv.bias"][rows],
                      "proj.weight": g["proj.weight"].chunk(t, 1)[r], "proj.bias": g["proj.bias"],
                      "up.weight": g["up.weight"].chunk(t, 0)[r], "up.bias": g["up.bias"].chunk(t, 0)[r],
                      "down.weight": g["down.weight"].chunk(t, 1)[r], "down.bias": g["down.bias"],
                      **{n: g[n] for n in SP_REPLICATED if n.split(".")[0].endswith("norm")}}}


def close(got, want) -> bool:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return False
    got, want = got.double(), want.double()
    return bool(torch.isfinite(got).all()) and \
        float((got - want).abs().max()) <= TOLERANCE * max(1.0, float(want.abs().max()))


def values(part: str, r: int, t: int, got: dict, want: dict, others_right: bool | None) -> list[Problem]:
    where = f"{WHAT[part]}, rank {r} of t = {t}"
    wrong = [k for k in ("out", "in_grad") if not close(got.get(k), want[k])]
    params = [n for n, w in want["grads"].items() if n not in SP_REPLICATED
              and not close((got.get("grads") or {}).get(n), w)]
    if not wrong and not params:
        return []
    if "out" in wrong:
        said = (f"{WHO}: {where}: the output on this rank's positions is not one process's block's (shape "
                f"{_shape(got.get('out'))}, wanted {tuple(want['out'].shape)}: the rank's own s/t positions)")
        if part == "dropout" and others_right:
            said += (": right without dropout, wrong with it. A sequence shard's residual masks must be its slice "
                     "of the (b, s, h) mask one process draws from the shared stream (every rank draws the whole "
                     "mask and keeps its positions), and each rank's attention mask is its heads' over the whole "
                     "sequence, from its own stream")
        return [Problem(said, rank=r)]
    names = (["the input's gradient"] if "in_grad" in wrong else []) + [f"{n}'s gradient" for n in params[:4]]
    said = f"{WHO}: {where}: the output is right but {', '.join(names)} not one process's"
    if "in_grad" in wrong:
        said += (": the backward of the all-gather before a column-parallel layer is a reduce-scatter of the "
                 "gathered input's gradient (each rank's partial sums over its heads or columns, added and "
                 "split back to the positions), and that of the reduce-scatter after a row-parallel one an "
                 "all-gather")
    return [Problem(said, rank=r)]


def replicated(part: str, t: int, grads: list[dict], want: dict, values_right: bool = True) -> list[Problem]:
    """grads[r]: rank r's gradients; want: one process's (whole). Where the part's values are wrong (a cause the values
    part names), only whether the ranks' gradients agree: summed over the group, they are the same on every rank."""
    problems = []
    for n in SP_REPLICATED:
        w = want.get(n)
        have = [(g or {}).get(n) for g in grads]
        if not values_right:
            w = have[0] if isinstance(have[0], torch.Tensor) else w
        bad = [r for r, gv in enumerate(have) if not close(gv, w)]
        if not bad:
            continue
        tensors = [gv for gv in have if isinstance(gv, torch.Tensor) and tuple(gv.shape) == tuple(w.shape)]
        partial = len(tensors) == t and close(sum(gv.double() for gv in tensors), w)
        r = bad[0]
        if not values_right:
            problems.append(Problem(
                f"{WHO}: {WHAT[part]}, t = {t}: rank {r}'s {n} gradient differs from rank 0's: a parameter every "
                f"rank holds whole but uses on its own sequence shard gets its gradient from that shard alone; sum "
                f"it over tp.group (an all-reduce in the backward)", rank=r,
                gist=f"{n}'s gradient not summed over the ranks"))
        elif partial:
            problems.append(Problem(
                f"{WHO}: {WHAT[part]}, t = {t}: rank {r}'s {n} gradient is the part of its own s/t positions "
                f"only, and the ranks' gradients differ (added up over the ranks they are one process's). A "
                f"parameter every rank holds whole but uses on its own sequence shard (the LayerNorms, the "
                f"row-parallel layers' biases) gets its gradient from that shard alone: sum it over tp.group "
                f"(an all-reduce in the backward), or the replicas drift apart at the first optimizer step",
                rank=r, gist=f"{n}'s gradient not summed over the ranks"))
        else:
            problems.append(Problem(f"{WHO}: {WHAT[part]}, t = {t}: rank {r}'s {n} gradient is not one process's "
                                    f"(ranks {', '.join(map(str, bad))} of {t})", rank=r))
        break
    return problems


def memory(r: int, saved: dict, shape) -> list[Problem]:
    b, s, h, a, e, t = shape
    want = sp_kept_bytes(b, s, h, a, e, t)
    got = held(saved)
    if got <= want * (1 + SLACK):
        return []
    where = ("autograd's saved tensors, each storage once, the parameters left out" if got == saved.get("bytes", 0)
             else f"every storage its forward left alive, each once, the parameters and the output left out; "
                  f"autograd saved {saved.get('bytes', 0):,} B of it, the rest is kept elsewhere (on ctx, in a "
                  f"closure): the lab counts it wherever it is")
    said = (f"{WHO}: rank {r} of t = {t} kept {got:,} B for the backward ({where}); a sequence-parallel rank keeps "
            f"{want:,} B here, every activation on its s/t positions (tensor parallelism alone keeps "
            f"{tp_kept_bytes(b, s, h, a, e, t):,} B)")
    extra, gathered = got - want, sp_gathered_extra(b, s, h, e, t)
    piece, whole = e * b * s * h // t, e * b * s * h
    kept = saved.get("kept") or []
    # a storage of a whole (b, s, h) activation saved through a view of a part of it (a mask sliced to the positions)
    sliced = [k for k in kept if k[0] == whole and k[1] and max(n for _, n in k[1]) < whole]
    if sliced and extra >= len(sliced) * (whole - piece) * (1 - SLACK):
        said += (f": {extra:,} B more. {len(sliced)} tensor(s) saved for the backward are views of {whole:,}-byte "
                 f"storages ((b, s, h): the whole sequence) holding {max(n for _, n in sliced[0][1]):,} B: a residual "
                 f"mask sliced to the rank's positions keeps the whole mask alive. Copy the slice (.clone())")
    elif abs(extra - gathered) <= SLACK * want:
        said += (f": {extra:,} B more, as much as the gathered inputs of the two column-parallel layers (qkv, up: "
                 f"2 x (t - 1)/t x sbh elements). A column-parallel layer on a sequence shard keeps its shard only "
                 f"and gathers it again in the backward (an autograd Function saving the shard): autograd's "
                 f"F.linear on the all-gather's output keeps the whole gathered input")
    elif abs(extra / piece - round(extra / piece)) < 0.01:
        said += (f": {extra:,} B more, {round(extra / piece)} x a shard's activation (sbh/t elements): something "
                 f"kept whole that a sequence-parallel rank keeps on its positions only")
    return [Problem(said, rank=r)]


def held(saved: dict) -> int:
    """What the rank's forward kept: autograd's saved tensors, or all it left alive (the kind's live scan: what an
    answer keeps on ctx outside save_for_backward, or in a closure) where that is more."""
    return max(saved.get("bytes", 0), saved.get("alive", 0))


def kept_gathered(saved: dict, shape) -> bool:
    """Whether a rank's forward (dropout on) kept the column layers' gathered inputs, by their bytes."""
    b, s, h, a, e, t = shape
    extra = held(saved) - sp_kept_bytes(b, s, h, a, e, t)
    return extra >= sp_gathered_extra(b, s, h, e, t) * (1 - SLACK)


def traffic(r: int, got: dict, shape, gathered_kept: bool = False) -> list[Problem]:
    """`gathered_kept`: the rank's forward kept the gathered inputs (the memory part names it), so its backward
    gathers them again no more: 2 all-gathers there, not 4. Without those bytes kept, 2 is a mistake of its own (the
    backward's input gathered from something the lab does not count?)."""
    b, s, h, a, e, t = shape
    want = sp_traffic(b, s, h, e, t)
    problems = []
    for direction in ("forward", "backward"):
        calls = got.get(direction) or []
        by = {k: sorted(x[1] for x in calls if x[0] == k) for k in ("all_gather", "reduce_scatter", "all_reduce")}
        ag, rs = want[direction]["all_gather"], want[direction]["reduce_scatter"]
        ok_ag = by["all_gather"] == sorted(ag) or (direction == "backward" and gathered_kept
                                                   and by["all_gather"] == sorted(ag[:2]))
        big = [n for n in by["all_reduce"] if n > SP_NORM_BYTES * h * e]
        if direction == "forward" and by["all_reduce"]:
            big = big or by["all_reduce"]
        others = sorted({x[0] for x in calls} - {"all_gather", "reduce_scatter", "all_reduce"})
        if ok_ag and by["reduce_scatter"] == sorted(rs) and not big and not others:
            continue
        said = (f"{WHO}: rank {r} of t = {t}, {direction}: {_calls(by, others)}; a sequence-parallel block makes "
                f"{len(ag)} all-gathers of {ag[0]:,} B (its shard) and {len(rs)} reduce-scatters of {rs[0]:,} B "
                f"(the whole partial sums) per rank"
                + (" (the column layers gather their input again in the backward: their shard is what they keep)"
                   if direction == "backward" else ""))
        if big:
            said += (f". An all-reduce of {max(big):,} B is tensor parallelism's: with the sequence split, the "
                     f"all-reduce after a row-parallel layer becomes a reduce-scatter to the positions, and the "
                     f"copy before a column-parallel layer an all-gather of them")
        problems.append(Problem(said, rank=r))
    return problems


def _calls(by: dict, others: list) -> str:
    parts = [f"{len(v)} {k.replace('_', '-')}s" + (f" ({', '.join(f'{n:,}' for n in sorted(set(v)))} B)" if v else "")
             for k, v in by.items()]
    return ", ".join(parts + [f"and {', '.join(others)}" for _ in others[:1]])


def _shape(v) -> str:
    return str(tuple(v.shape)) if isinstance(v, torch.Tensor) else type(v).__name__


def judge_sp(outcome, parts=None) -> dict[str, list[Problem]]:
    """{part judged: problems} over the case's parts (or `parts` of them: "block", "dropout") and ranks."""
    settings = settings_of(outcome.case)
    parts = [p for p in settings.parts if parts is None or p in parts]
    cfg, t = outcome.case.config, outcome.case.stages
    found = {p: [] for p in SP_JUDGED}
    if not settings.values:
        found.pop("values")
        found.pop("replicated")
    if "dropout" not in parts:
        found.pop("memory")
    obs = [outcome.obs.get(r) or {} for r in range(t)]
    right_without = None
    if "dropout" in parts and "block" not in parts and "block" in settings.parts and "values" in found:
        block = [(o.get("parts") or {}).get("block") or {} for o in obs]
        right_without = all("out" in rec and not values("block", r, t, rec, expected("block", cfg, t, r), None)
                            for r, rec in enumerate(block))
    for part in parts:
        recs = [(o.get("parts") or {}).get(part) or {} for o in obs]
        failed = []
        for r, rec in enumerate(recs):
            if rec.get("raised"):
                raised = rec["raised"]
                line = f" at {raised['line']}" if raised.get("line") else ""
                failed.append(Problem(f"{WHO}: {WHAT[part]}, rank {r} of t = {t} raised {raised['type']}{line}: "
                                      f"{raised['message']}", rank=r, gist=f"{WHO} raised {raised['type']}"))
            elif rec.get("returned"):
                failed.append(Problem(f"{WHO}(block, tp) returned {rec['returned']}", rank=r))
            elif "out" not in rec:
                failed.append(Problem(f"{WHO}: {WHAT[part]}: rank {r} recorded nothing of it", rank=r))
        if failed:
            for p in found:
                found[p] += failed[:1]
            continue
        if "values" in found:
            wants = [expected(part, cfg, t, r) for r in range(t)]
            wrong = [p for r in range(t) for p in values(part, r, t, recs[r], wants[r],
                                                          right_without if part == "dropout" else None)]
            found["values"] += wrong[:2]
            if part == "block":
                right_without = not wrong
            found["replicated"] += replicated(part, t, [rec.get("grads") for rec in recs], _full(part, cfg, t)["grads"],
                                              values_right=not wrong)
        for r, rec in enumerate(recs):
            shape = rec.get("shape")
            if "memory" in found and part == "dropout":
                found["memory"] += memory(r, rec.get("saved") or {}, shape)
            dropped = ((obs[r].get("parts") or {}).get("dropout") or {})
            kept = bool(dropped.get("shape")) and kept_gathered(dropped.get("saved") or {}, dropped["shape"])
            found["traffic"] += traffic(r, rec, shape, gathered_kept=kept)
    # one problem per rank is enough to say: the first two ranks' of each part
    return {p: v[:3] for p, v in found.items()}


# ---- the training (kind "sp_train", kind_sp_train.py) -----------------------------------------------------------
@functools.lru_cache(maxsize=8)
def single_process(cfg, steps: int, lr: float, perturbed: int | None = None) -> list[float]:
    """One process's curve of the digits model (topics/training/single_process.py), AdamW with q18's eps; with
    `perturbed`, the embedding changed as the run's rank 0 reported."""
    from lab_src.topics.long_sequences.shards import ADAM_EPS
    from lab_src.topics.training.digits import Digits
    from lab_src.topics.training.single_process import train_single_process
    return train_single_process(cfg, Digits(cfg, 1), steps, lr, perturbed=perturbed, eps=ADAM_EPS)["losses"]


def sp_training(outcome, values_right: bool = True) -> list[Problem]:
    """Each rank's curve against one process's, within q13's tolerance; the replicated parameters equal on every rank
    after training. `values_right`: whether the block cases found the block's numbers right (where not, a curve
    that leaves one process's is their consequence)."""
    from lab_src.topics.training.records import CURVE_RTOL, relative_differences
    cfg, t, s = outcome.case.config, outcome.case.stages, settings_of(outcome.case)
    seed = None
    if s.perturb:
        seed = (outcome.obs.get(0) or {}).get("perturbed")
        if not isinstance(seed, int):
            return [Problem("rank 0's record of the training lacks the seed of the change the lab made to the "
                            "embedding: the record was rewritten", rank=0)]
    want = single_process(cfg, s.steps, s.lr, seed)
    rtol = CURVE_RTOL[cfg.dtype]
    problems = []
    for r in range(t):
        got = (outcome.obs.get(r) or {}).get("losses") or []
        if len(got) != len(want):
            problems.append(Problem(f"{WHO}: the training on rank {r} reported {len(got)} losses for {len(want)} "
                                    f"steps", rank=r))
            continue
        diffs = relative_differences(got, want)
        if max(diffs) <= rtol:
            continue
        bad = next(i for i, d in enumerate(diffs) if d > rtol)
        problems.append(Problem(
            f"{WHO}: the digits model trained on t = {t} ranks leaves one process's curve at step {bad} on rank {r}: "
            f"{got[bad]:.6g} against {want[bad]:.6g} (relative difference {diffs[bad]:.1e}, tolerance {rtol:.0e})"
            + ("; the block's numbers are wrong already (above): the curve follows from them" if not values_right
               else ""), rank=r, consequence=not values_right))
        break
    norms = [(outcome.obs.get(r) or {}).get("norms") or {} for r in range(t)]
    for r in range(1, t):
        differ = [n for n, v in norms[r].items() if n in norms[0] and not torch.equal(v, norms[0][n])]
        if differ:
            problems.append(Problem(
                f"{WHO}: after training, {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''} differ between "
                f"ranks 0 and {r}: a parameter every rank holds whole stays identical only if every rank applies the "
                f"same gradient, the sum over the group of what each rank's positions gave", rank=r))
            break
    return problems


def training_line(outcome) -> str:
    """What the check prints of a training: the first and last loss, and each rank's largest distance from one
    process's curve."""
    from lab_src.topics.training.records import relative_differences
    s = settings_of(outcome.case)
    want = single_process(outcome.case.config, s.steps, s.lr, (outcome.obs.get(0) or {}).get("perturbed"))
    rows = [f"    one process: loss {want[0]:.4f} -> {want[-1]:.4f} in {len(want)} steps"]
    for r, o in sorted(outcome.obs.items()):
        got = o.get("losses") or []
        far = max(relative_differences(got, want)) if len(got) == len(want) else None
        rows.append(f"    rank {r}: {got[-1] if got else float('nan'):.4f} at the last step, "
                    + (f"largest relative distance from one process {far:.1e}" if far is not None
                       else f"{len(got)} losses"))
    return "\n".join(rows)
