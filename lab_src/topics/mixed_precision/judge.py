"""Parent side of q26 (mixed_precision_layer, LossScaler): judge what the ranks of a "mixed_precision" case recorded
(kind.py), against one process computing the same steps with the same casts (model.py `one_step`), in this process,
with as many threads as a rank has (the same kernels: each replica's gradient in the compute dtype is then the ranks'
to the bit, and what is left to allow is the float32 arithmetic the answer may order otherwise).

Five parts (records.py PARTS), read from behaviour:
    gradients  each step, from the float32 masters the ranks held before it (rebuilt from every rank's shard): the
               shards' gradients against one process's sum over the replicas / n, within the float32 sum's bound
               2 (n - 1) u32 sum_i |g_i| / n per element (u32 = 2^-24: a sum of n terms in any order, each replica's
               gradient the same to the bit); the shards after the step against p - lr g within that times lr plus
               one float32 rounding of p (2 u32 |p|)
    training   the parameters after every step against one process's training from the start (its own masters):
               once the masters differ by a float32 rounding, a weight cast to the compute dtype may land one of its
               ulps away, so each step may differ by lr times the compute dtype's rounding of the gradient, twice (the
               weights' cast and the gradient's own): |p_k - q_k| <= sum_{j <= k} lr 2 u_c max|g_j| / s_j (s_j the
               loss scale), with u_c 2^-8 in bfloat16, 2^-11 in float16
    bytes      each gather carried the block's elements in the compute dtype (2 bytes each: half of float32's), each
               reduce-scatter the block's gradient in float32; per step and block two gathers (forward, backward) and
               one reduce-scatter
    dtypes     the shard (the master) and its gradient float32; a master in bfloat16 named by its lost updates
    scaling    fp16: the scale after each step as GradScaler's rules give it from the steps that found an inf (the
               lab's, or an overflow one process finds too); a step with an inf left every rank's shard as it was
"""
from __future__ import annotations

import torch

from lab_src.harness.baselines import threads_of_a_rank
from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.compare import scale_between
from lab_src.judge.problems import Problem
from lab_src.topics.mixed_precision import model as lab_model
from lab_src.topics.mixed_precision.records import INIT_SCALE, ITEMSIZE, UNIT_ROUNDOFF, scale_trajectory

U32 = UNIT_ROUNDOFF["float32"]
SUBNORMAL_HALF = {"float16": 2.0 ** -25, "bfloat16": 2.0 ** -134}


def _ranks(outcome) -> list[int]:
    return sorted(outcome.obs, key=lambda r: outcome.obs[r].get("position", r))


def _whole(outcome, k: int, key: str) -> list[torch.Tensor] | None:
    """Each block's whole flat vector of step k's record `key`, every rank's shard in order (None: one missing)."""
    ranks = _ranks(outcome)
    per = [(outcome.obs[r].get("steps") or [])[k].get(key) if k < len(outcome.obs[r].get("steps") or []) else None
           for r in ranks]
    if any(p is None or any(t is None for t in p) for p in per):
        return None
    return [torch.cat([p[b] for p in per]).double() for b in range(len(per[0]))]


def replay(outcome) -> dict:
    """One process's side: per step k, `one_step` from the masters the ranks held before it ("steps"), and one
    process's training from the start ("train": masters after each step, the scale before each)."""
    case = outcome.case
    s, cfg, n = settings_of(case), case.config, case.stages
    model = lab_model.blocks(cfg, s)
    start = [lab_model.flat_of(b) for b in model]
    k_steps = min(len(outcome.obs[r].get("steps") or []) for r in outcome.obs)
    found_seq = []
    with threads_of_a_rank():
        per_step = []
        for k in range(k_steps):
            before = _whole(outcome, k, "before")
            if before is None:
                break
            # the scale the ranks used (so that a wrong scale is the scaling part's problem alone)
            got = lab_model.one_step(cfg, s, model, [b.float() for b in before], k, n, 1.0 / _inv_scale(outcome, k))
            per_step.append(got)
            found_seq.append(got["found"])
        train, masters, scale, found_train = [], start, INIT_SCALE if s.scaled else 1.0, []
        for k in range(k_steps):
            got = lab_model.one_step(cfg, s, model, masters, k, n, scale)
            train.append({"after": got["after"], "scale": scale, "summed": got["summed"]})
            masters = got["after"]
            found_train.append(got["found"])
            if s.scaled:
                scale = scale_trajectory(found_train, s.growth_interval)[-1]
    return {"steps": per_step, "train": train, "found": found_seq}


def _bound(parts: list[torch.Tensor], n: int) -> torch.Tensor:
    return 2 * max(n - 1, 1) * U32 * torch.stack([p.double().abs() for p in parts]).sum(0) / n


def gradient_problems(outcome, ref) -> list[Problem]:
    s, n = settings_of(outcome.case), outcome.case.stages
    ranks = _ranks(outcome)
    for k, want in enumerate(ref["steps"]):
        if len({st[k].get("scale") for st in (outcome.obs[r].get("steps") or [] for r in ranks) if k < len(st)}) > 1:
            break               # the ranks scaled their losses alike no longer: the scaling part's problem
        got = _whole(outcome, k, "grad")
        if got is None:
            return [Problem(f"step {k}: a shard's .grad stayed None after the backward: the backward must return "
                            f"the reduce-scattered gradient for the shard", rank=ranks[0])]
        # a gradient or a shard kept in another dtype than float32 is rounded to it: allowed here, the dtypes
        # part's problem
        g_round = _stored_rounding(outcome, "grad_dtype")
        p_round = _stored_rounding(outcome, "shard_dtype")
        floor = _stored_floor(outcome)
        for b, (g, w) in enumerate(zip(got, want["summed"])):
            w = w.double()
            tol = _bound([p[b] for p in want["parts"]], n) + g_round * w.abs() + floor
            fin = torch.isfinite(w)
            if not torch.equal(fin, torch.isfinite(g)) or ((g - w).abs()[fin] > tol[fin]).any():
                return [_grad_problem(outcome, k, b, g, w, tol, fin, n, s)]
        after = _whole(outcome, k, "after")
        if after is None:
            break
        if want["found"]:
            continue                 # the scaling part judges a step with an inf
        before = _whole(outcome, k, "before")
        for b, (a, w) in enumerate(zip(after, want["after"])):
            w = w.double()
            # a gradient kept in a low dtype rounds three times on its way into p: stored, unscaled, times lr
            step_tol = (s.lr * (_bound([p[b] for p in want["parts"]], n) + 3 * g_round * want["summed"][b].double().abs())
                        * _inv_scale(outcome, k) + (2 * U32 + p_round) * w.abs() + floor)
            if ((a - w).abs() > step_tol).any():
                moved = (a != before[b]).double().mean().item()
                return [Problem(f"step {k}: the shards of block {b} after the optimizer's step differ from one "
                                f"process's p - lr * g (largest difference {float((a - w).abs().max()):.3g}, "
                                f"allowed {float(step_tol.max()):.3g}; {moved:.0%} of the elements moved): the "
                                f"gradient the optimizer stepped with is not the shard's, unscaled", rank=ranks[0])]
    return []


def _stored_rounding(outcome, key: str) -> float:
    """The unit roundoff of the dtype some rank kept the shard or its gradient in (`key`), where it is not float32."""
    dtypes = {st.get(key) for o in outcome.obs.values() for st in o.get("steps") or []}
    return max([UNIT_ROUNDOFF.get(d, 0.0) for d in dtypes if d and d != "float32"] or [0.0])


def _stored_floor(outcome) -> float:
    """Half the spacing of the subnormal numbers of the dtype the shard or its gradient was kept in, where it is not
    float32: the absolute rounding of a value too small for the relative one (a LayerNorm bias that starts at 0)."""
    dtypes = {st.get(key) for o in outcome.obs.values() for st in o.get("steps") or []
              for key in ("shard_dtype", "grad_dtype")}
    return max([SUBNORMAL_HALF.get(d, 0.0) for d in dtypes if d and d != "float32"] or [0.0])


def _inv_scale(outcome, k: int) -> float:
    """1 / the scale step k's loss was multiplied by (the scale the ranks recorded after step k - 1)."""
    s = settings_of(outcome.case)
    if not s.scaled:
        return 1.0
    if k == 0:
        return 1.0 / INIT_SCALE
    prev = (outcome.obs[_ranks(outcome)[0]].get("steps") or [])[k - 1].get("scale")
    return 1.0 / prev if prev else 1.0 / INIT_SCALE


def _grad_problem(outcome, k, b, g, w, tol, fin, n, s) -> Problem:
    ranks = _ranks(outcome)
    if not torch.equal(fin, torch.isfinite(g)):
        return Problem(f"step {k}: block {b}'s gradient has inf or NaN where one process's has none, or none where "
                       f"it has (elements {int((fin != torch.isfinite(g)).sum())})", rank=ranks[0])
    diff = (g - w).abs()[fin]
    c = scale_between(g[fin], w[fin])
    scatter = _scatter_dtype(outcome)
    if c is not None and n > 1 and abs(c - n) < 1e-3 * n:
        why = f"they are {n}x one process's: the reduce-scattered sum was not divided by dp.size"
    elif c is not None and n > 1 and abs(c - 1 / n) < 1e-3 / n:
        why = f"they are 1/{n} of one process's: divided by dp.size twice"
    elif scatter and scatter != "float32":
        why = (f"the gradient was reduce-scattered in {scatter}: each partial sum of the ring rounded to its "
               f"{'8' if scatter == 'bfloat16' else '11'} bits of mantissa, the values drift; cast the flat gradient "
               f"to float32 before dp.reduce_scatter (FSDP2's reduce_dtype=float32)")
    elif c is not None and abs(c - 1) > 1e-3:
        why = f"they are {c:.3g}x one process's"
    else:
        why = "not the sum of the replicas' gradients computed with the contract's casts"
    return Problem(f"step {k}: the shards' gradients of block {b} (rebuilt from every rank's shard) differ from one "
                   f"process's over the replicas in {int((diff > tol[fin]).sum())} of {diff.numel()} elements, by up "
                   f"to {float(diff.max()):.3g} (allowed: the float32 sum's rounding, up to {float(tol.max()):.3g}): "
                   f"{why}", rank=ranks[0])


def _scatter_dtype(outcome) -> str | None:
    """The dtype the answer reduce-scattered in, from the bytes per element the ring carried."""
    for r in _ranks(outcome):
        for step in outcome.obs[r].get("steps") or []:
            for nbytes, elements in step.get("scatters") or []:
                if elements:
                    return {4: "float32", 2: "bfloat16" if settings_of(outcome.case).dtype == "bfloat16"
                            else "float16", 8: "float64"}.get(nbytes // elements)
    return None


def training_problems(outcome, ref) -> list[Problem]:
    s = settings_of(outcome.case)
    uc = UNIT_ROUNDOFF[s.dtype]
    allowed = 0.0
    for k, want in enumerate(ref["train"]):
        got = _whole(outcome, k, "after")
        if got is None:
            break
        g_max = max(float(g.abs()[torch.isfinite(g)].max()) if torch.isfinite(g).any() else 0.0
                    for g in want["summed"])
        allowed += s.lr * 2 * uc * g_max / want["scale"]
        worst = max(float((a - w.double()).abs().max()) for a, w in zip(got, want["after"]))
        if worst > allowed:
            return [Problem(f"after step {k} the parameters differ from one process's float32-master training from "
                            f"the start by up to {worst:.3g} (allowed {allowed:.3g}: lr x 2 u x the largest gradient "
                            f"per step, u = {uc:g} the unit roundoff of {s.dtype})", rank=_ranks(outcome)[0])]
    return []


def byte_problems(outcome) -> list[Problem]:
    problems = []
    for r in _ranks(outcome):
        o = outcome.obs[r]
        for k, step in enumerate(o.get("steps") or []):
            found = _step_bytes(outcome, k, step, o.get("layers_flat") or {})
            if found:
                problems.append(Problem(found, rank=r))
                break
    return problems + wire.byte_problems(outcome)


def _step_bytes(outcome, k: int, step: dict, layers: dict) -> str | None:
    s = settings_of(outcome.case)
    item = ITEMSIZE[s.dtype]
    gathers = step.get("gathers") or []
    for layer, nbytes, elements in gathers:
        if elements and nbytes != elements * item:
            per = nbytes // elements
            why = (" (twice the compute dtype's: the shard was gathered in float32 and cast after; cast it before "
                   "the gather, so that the gather carries half the bytes)" if per == 4 else "")
            return (f"step {k}: a gather of {layer} carried {nbytes:,} B for {elements:,} elements, {per} B each, not "
                    f"{item} ({s.dtype}){why}")
    for nbytes, elements in step.get("scatters") or []:
        if elements and nbytes != elements * 4:
            return (f"step {k}: a reduce-scatter carried {nbytes // elements} B per element, not float32's 4: the "
                    f"gradients are reduced in float32 (FSDP2's reduce_dtype), so that the sum of low-precision "
                    f"gradients does not round at every add")
    # blocks of one size have shards of one length, which is all a gather's note knows of its layer: counted together
    scatters = len(step.get("scatters") or [])
    if len(gathers) != 2 * len(layers) or scatters != len(layers):
        return (f"step {k}: {len(gathers)} gathers and {scatters} reduce-scatters for {len(layers)} blocks: each "
                f"block gathers once for its forward and once for its backward ({2 * len(layers)}), and "
                f"reduce-scatters once ({len(layers)})")
    return None


def dtype_problems(outcome, ref) -> list[Problem]:
    problems = []
    for r in _ranks(outcome):
        steps = outcome.obs[r].get("steps") or []
        if not steps:
            continue
        first = steps[0]
        if first.get("shard_dtype") != "float32":
            problems.append(Problem(_lost_updates(outcome, ref, r, first.get("shard_dtype")), rank=r))
        elif first.get("grad_dtype") not in (None, "float32"):
            problems.append(Problem(f"the shard's gradient is {first.get('grad_dtype')}: the optimizer steps the "
                                    f"float32 master with a float32 gradient (cast before the reduce-scatter)", rank=r))
    return problems


def _lost_updates(outcome, ref, r: int, dtype) -> str:
    """A master kept in a low precision, named by the updates its steps lost: elements of this rank's shard that
    did not move in a clean step although one process's float32 master moved them."""
    o = outcome.obs[r]
    pos = o.get("position", 0)
    lost = total = 0
    for k, step in enumerate(o.get("steps") or []):
        if k >= len(ref["steps"]) or ref["steps"][k]["found"]:
            continue
        for b, (before, after) in enumerate(zip(step["before"], step["after"])):
            whole_before = _whole(outcome, k, "before")[b]
            want = ref["steps"][k]["after"][b].double()
            offset = sum(int(x.numel()) for x in (outcome.obs[q]["steps"][k]["before"][b] for q in _ranks(outcome)
                                                    if outcome.obs[q].get("position", q) < pos))
            w_moved = want[offset:offset + before.numel()] != whole_before[offset:offset + before.numel()]
            stayed = after == before
            lost += int((stayed & w_moved).sum())
            total += int(w_moved.sum())
    return (f"the shard (the master copy) is {dtype}, not float32: in the clean steps {lost:,} of the {total:,} "
            f"updates one process's float32 master made to this rank's shard were lost (p + lr g rounded back to p: "
            f"an update below half an ulp of the weight vanishes: {lost_example(dtype)}). Keep the shard in "
            f"float32 and cast it to the compute dtype before each gather")


def lost_example(dtype) -> str:
    return {"bfloat16": "in bfloat16 1 + 1e-3 == 1", "float16": "in float16 1 + 1e-4 == 1"}.get(
        dtype, f"in {dtype} small updates vanish")


def scaling_problems(outcome, ref) -> list[Problem]:
    s = settings_of(outcome.case)
    if not s.scaled:
        return []
    ranks = _ranks(outcome)
    found = ref["found"]
    for k, inf in enumerate(found):
        if not inf:
            continue
        stepped = [r for r in ranks if not all(torch.equal(a, b) for a, b in zip(outcome.obs[r]["steps"][k]["after"],
                                                                                 outcome.obs[r]["steps"][k]["before"]))]
        if stepped:
            where = (f"the lab put an inf into position {s.inject_rank}'s shard gradient"
                     if k == s.inject_step else "an overflow gave inf or NaN in some rank's shard gradient")
            skipped = [r for r in ranks if r not in stepped]
            if skipped:
                return [Problem(f"step {k}: {where}; ranks {skipped} skipped the step but ranks {stepped} stepped "
                                f"their shards: the replicas' parameters now disagree. The found-inf flag must be "
                                f"agreed over the group (dp.all_reduce of it) so that every rank skips together",
                                rank=stepped[0])]
            return [Problem(f"step {k}: {where}, and every rank stepped anyway: a step whose gradients hold an inf or "
                            f"NaN is skipped (the parameters stay) and the scale halved", rank=ranks[0])]
    want = scale_trajectory(found, s.growth_interval)
    for r in ranks:
        got = [st.get("scale") for st in outcome.obs[r].get("steps") or []]
        for k, (g, w) in enumerate(zip(got, want)):
            if g is None or abs(g - w) > 1e-9 * w:
                prev = want[k - 1] if k else INIT_SCALE
                if found[k] and g == prev:
                    why = "the step found an inf: the scale is halved (backoff_factor 0.5)"
                elif not found[k] and w > prev and g == prev:
                    why = (f"{s.growth_interval} clean steps in a row: the scale doubles (growth_factor 2, "
                           f"growth_interval {s.growth_interval}) and the count starts again")
                else:
                    why = "GradScaler's rules: x0.5 on a step with an inf, x2 after growth_interval clean steps"
                return [Problem(f"the loss scale after step {k} is {g}, not {w:g} (scales expected "
                                f"{', '.join(f'{x:g}' for x in want)}): {why}", rank=r)]
    return []


def judge_run(outcome) -> dict[str, list[Problem]]:
    ref = replay(outcome)
    out = {"gradients": gradient_problems(outcome, ref), "training": training_problems(outcome, ref),
           "bytes": byte_problems(outcome), "dtypes": dtype_problems(outcome, ref),
           "scaling": scaling_problems(outcome, ref)}
    return out if settings_of(outcome.case).scaled else {k: v for k, v in out.items() if k != "scaling"}
