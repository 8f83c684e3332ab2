"""Parent side of q22 (fsdp_layer): judge what the ranks of an "fsdp" case recorded (kind_fsdp.py).

Three parts, read from behaviour, never from the answer's form:
    values   every replica's whole gradients (each block's rebuilt from the ranks' shards) after each SGD step
             equal one process's over the global batch (topics/data_parallel/judge_buckets.py computes them);
             in a digits training, the replicas' mean loss at every step on one process's curve (q13's tolerance)
    memory   at rest the stage holds the replicated parameters and its blocks' shards, nothing of their whole
             parameters; at the peak of a step at most two layers' gathered copies beside them (the one in use,
             and one prefetched); none left after the step; at the first gather of a backward, no more than
             HIDDEN_LAYERS layers' worth of tensors the lab did not hand out (every live tensor of the rank counted)
    counts   per step and block: one gather per micro-batch's forward and one per its backward, one reduce-scatter
             per backward; a backward's gather does not count where the rank already held the weights from the
             forward (the memory part's scan)
"""
from __future__ import annotations

from dataclasses import replace

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.compare import close, scale_between
from lab_src.judge.grid_baseline import grid_baseline_grads
from lab_src.judge.problems import Problem, first_wrong_steps

SLACK_BYTES = 4096          # buffers and small tensors a module may keep
GATHERED_AT_ONCE = 2        # the layer in use and one prefetched
# The rank's tensors beyond what the lab declared at the first gather of a backward (kind_fsdp.py's scan,
# harness/live.py), in units of the stage's largest layer's whole weights. Measured on the five hidden cases with the
# reference (3 runs) and the valid variants of tests/test_q22_fsdp_layer.py (FSDP1's resized storage, torch.split,
# the block registered: 1 run, and every run of that test since), every rank, first and last step: 4,100 to 41,480 B,
# 0.08 to 0.73 of a layer (the gradient in flight, a micro-batch's activation: 32,768 B in the digits trainings; the
# last stage's outputs the step keeps, 4 x 8,192 B), the same bytes every run (tensors alive at a set moment, not
# timing). A copy of every block's weights kept for the backward is at least 2.08 layers there (a stage of two
# blocks, one micro-batch in flight: cohort q22_clone_saved). 1.5 layers: twice the noise, below the least copy.
HIDDEN_LAYERS = 1.5
# What a problem is, where another part or the visible check decides by it (`gist`: said once wherever it shows)
SCALED = "q22: the gradients are one process's scaled"        # the reduce-scatter's sum, not divided (or twice)
KEPT = "q22: gathered copies kept beyond their layer's forward"  # the peak, or copies left after the step
FEW = f"{KEPT}: too few gathers"                                  # what that leaves of the backwards' gathers


def curve_problems(outcome) -> list[Problem]:
    """A digits training: the replicas' mean loss at every step against one process's, within q13's tolerance."""
    from lab_src.topics.training.digits import Digits
    from lab_src.topics.training.records import curve_tolerance, relative_differences
    from lab_src.topics.training.single_process import train_single_process
    case = outcome.case
    s = case.settings
    want = train_single_process(case.config, Digits(case.config), s["steps"], s["lr"])["losses"]
    pp = case.config.num_stages
    last = [r for r in sorted(outcome.obs) if r % pp == pp - 1]
    curves = [[st.get("loss") for st in outcome.obs[r].get("steps") or []] for r in last]
    if not curves or any(len(c) != len(want) or any(x is None for x in c) for c in curves):
        return [Problem("the last stages recorded no loss for every step: does the 1F1B step return the loss?")]
    got = [sum(c[k] for c in curves) / len(curves) for k in range(len(want))]
    rtol = curve_tolerance(case.config.dtype)
    diffs = relative_differences(got, want)
    off = [k for k, d in enumerate(diffs) if d > rtol]
    if not off:
        return []
    k = off[0]
    return [Problem(f"the replicas' mean loss leaves one process's curve at step {k}: {got[k]:.6f} against "
                    f"{want[k]:.6f} (relative difference {diffs[k]:.2g}, allowed {rtol:g}); the gradients the "
                    f"shards receive, or the replicated parameters', are not the whole batch's average",
                    rank=last[0])]


def value_problems(outcome) -> list[Problem]:
    if settings_of(outcome.case).digits:
        return curve_problems(outcome)
    want_steps = grid_baseline_grads(outcome.case, settings_of(outcome.case).steps)
    n = outcome.case.config.dp_size
    first: dict[int, tuple[int, Problem]] = {}
    for r, o in sorted(outcome.obs.items()):
        for k, step in enumerate(o.get("steps") or []):
            got = step.get("grads") or {}
            none = [name for name, g in got.items() if g is None]
            if none:
                first[r] = (k, Problem(f"step {k}: {none[0]} has no gradient: its shard's .grad stayed None (the "
                                       f"backward must return the reduce-scattered gradient for the shard)", rank=r))
                break
            wrong = [name for name in got if name in want_steps[k] and not close(got[name], want_steps[k][name])]
            if not wrong:
                continue
            g = torch.cat([got[x].reshape(-1).double() for x in wrong])
            w = torch.cat([want_steps[k][x].reshape(-1).double() for x in wrong])
            c = scale_between(g, w)
            blocks = all(x.startswith("blocks.") for x in wrong)
            gist = ""
            if c is not None and n > 1 and abs(c - n) < 1e-3 * n:
                why = f"they are {n}x one process's: the reduce-scattered sum was not divided by dp.size"
                gist = f"{SCALED}: not divided by n"
            elif c is not None and n > 1 and abs(c - 1 / n) < 1e-3 / n:
                why = f"they are 1/{n} of one process's: divided by dp.size twice"
                gist = f"{SCALED}: divided by n twice"
            elif c is not None and abs(c - 1) > 1e-3:
                why = f"they are {c:.3g}x one process's"
            else:
                why = f"largest difference {float((g - w).abs().max()):.3g}"
            where = "the blocks' (rebuilt from every rank's shard)" if blocks else "these"
            first[r] = (k, Problem(f"after step {k}, {len(wrong)} of {len(got)} gradients differ from one process's "
                                   f"over the global batch ({', '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}): "
                                   f"{where}; {why}", rank=r, gist=gist))
            break
    return first_wrong_steps(first, lambda k, earliest, cause: (
        f"after step {k} the gradients differ, step {earliest}'s having been right on this rank: another rank's "
        f"wrong step {earliest} went into the shards it gathers"))


def memory_problems(outcome) -> list[Problem]:
    problems = []
    for r, o in sorted(outcome.obs.items()):
        layers = o.get("layers_flat") or {}
        if not layers:
            continue
        elem = 8 if outcome.case.config.dtype == "float64" else 4
        shards = sum(s for _, s in layers.values()) * elem
        rest_allowed = o.get("replicated_bytes", 0) + shards + SLACK_BYTES
        if o.get("rest_bytes", 0) > rest_allowed:
            extra = o["rest_bytes"] - o.get("replicated_bytes", 0) - shards
            problems.append(Problem(f"at rest the stage holds {o['rest_bytes']:,} B, {extra:,} B more than the "
                                    f"replicated parameters and the blocks' shards ({shards:,} B): the modules "
                                    f"fsdp_layer returned still reach the blocks' whole parameters (an attribute, "
                                    f"a list, the block itself); free them once the shard is cut (p.data = "
                                    f"torch.empty(0)): FSDP keeps 1/n of them", rank=r))
            continue
        largest = max(total for total, _ in layers.values()) * elem
        for k, step in enumerate(o.get("steps") or []):
            if step.get("left"):
                problems.append(Problem(f"step {k}: {step['left'][0]}'s gathered weights were still held after the "
                                        f"step: a reference to the gathered tensor outlives the layer's forward or "
                                        f"backward (kept on the module, or saved for the backward)", rank=r,
                                        gist=f"{KEPT}: after the step"))
                break
            if step.get("peak", 0) > GATHERED_AT_ONCE * largest:
                held = sorted(set(step.get("peak_layers") or []))
                problems.append(Problem(
                    f"step {k}: at the peak the rank held {len(step.get('peak_layers') or [])} gathered copies at "
                    f"once (of {', '.join(held[:4])}{' ...' if len(held) > 4 else ''}; {step['peak']:,} B, "
                    f"against at most {GATHERED_AT_ONCE} layers, {GATHERED_AT_ONCE * largest:,} B): free each "
                    f"layer's gathered weights when its forward, or its backward, returns (saving them for the "
                    f"backward keeps every layer gathered until then)", rank=r, gist=f"{KEPT}: at the peak"))
                break
    return problems


def few_gathers_follow(problems: list[list[Problem]]) -> list[list[Problem]]:
    """Lists of problems (an exercise's, every case's) with each "too few gathers" marked as a consequence where
    some case showed its cause: gathered copies kept beyond their forward (a case whose memory part did not catch
    the copies, such as a stage of two blocks, shows only the count)."""
    if not any(p.gist.startswith(KEPT) and not p.consequence and p.gist != FEW for ps in problems for p in ps):
        return problems
    return [[replace(p, consequence=True) if p.gist == FEW else p for p in ps] for ps in problems]


def ring_may_be_at_fault(values: list[Problem]) -> bool:
    """Whether the gradients' problems leave the q19 ring under suspicion: not where every one of them is the
    gradients scaled by n or 1/n (a division by dp.size missing or doubled: the ring summed right)."""
    return any(not p.consequence and not p.gist.startswith(SCALED) for p in values)


def hidden_copies(outcome, r: int) -> tuple[int, int, str, float] | None:
    """(step, bytes, layer, in layers) of rank r's first scan that found more than HIDDEN_LAYERS layers' whole
    weights in tensors the lab did not hand out, at the first gather of a backward; None where none did."""
    o = outcome.obs[r]
    layers = o.get("layers_flat") or {}
    if not layers:
        return None
    elem = 8 if outcome.case.config.dtype == "float64" else 4
    largest = max(total for total, _ in layers.values()) * elem
    for k, step in enumerate(o.get("steps") or []):
        found = step.get("hidden") or []
        if found and found[0] > HIDDEN_LAYERS * largest:
            return k, found[0], found[1], found[0] / largest
    return None


def hidden_problems(outcome, skip=()) -> list[Problem]:
    """Whole weights kept where the watch of the gathered copies does not see them (a clone, a closure, a global):
    counted among every tensor the rank held at the first gather of a backward."""
    problems = []
    for r in sorted(outcome.obs):
        found = hidden_copies(outcome, r)
        if found is None or r in skip:
            continue
        k, nbytes, layer, layers = found
        problems.append(Problem(
            f"step {k}: this rank held {nbytes:,} B of tensors beyond what the lab gave it when {layer} was gathered "
            f"for its backward, as much as {layers:.1f} layers' whole weights: copies of gathered weights kept for "
            f"the backward outside the gathered tensors (a clone, a closure, a global, an attribute of ctx); the "
            f"lab counts every tensor the rank keeps, wherever it is. Free each layer's gathered weights when its "
            f"forward returns, and gather them again in the backward", rank=r))
    return problems


def count_problems(outcome, kept_ranks=()) -> list[Problem]:
    """Gathers per block (each gather names its shard, so its layer is known), reduce-scatters per stage (a flat
    gradient does not say whose it is when two blocks have the same size: they are counted together). Too few
    gathers on a rank in `kept_ranks` (its gathered copies outlived their forward: the memory part) are that problem's
    consequence: the backward computed with the copy kept instead of gathering again."""
    m = outcome.case.config.num_microbatches
    problems = []
    for r, o in sorted(outcome.obs.items()):
        layers = sorted(o.get("layers_flat") or {})
        for k, step in enumerate(o.get("steps") or []):
            counts = {layer: sum(1 for _, name, _ in step.get("gathers") or [] if name == layer) for layer in layers}
            off = [layer for layer in layers if counts[layer] != 2 * m]
            scatters = len(step.get("scatters") or [])
            kept = hidden_copies(outcome, r)
            if not off and kept is not None and kept[0] == k:
                problems.append(Problem(
                    f"step {k}: the backward's gathers were not what it computed with: when {kept[2]} was gathered "
                    f"for its backward, this rank already held {kept[1]:,} B of tensors beyond what the lab gave it "
                    f"({kept[3]:.1f} layers' whole weights, kept from the forward: see the memory part); FSDP "
                    f"gathers a layer again for each backward because it freed the forward's copy", rank=r))
                break
            if off and counts[off[0]] < 2 * m:
                problems.append(Problem(
                    f"{off[0]} was gathered {_times(counts[off[0]])} in a step of {m} micro-batches, not {2 * m} "
                    f"(step {k}): its backwards did not gather it again, so they computed with copies of its weights "
                    f"kept from the forwards; FSDP frees a layer's copy when its forward returns and gathers it for "
                    f"each backward", rank=r, consequence=bool(kept_ranks), gist=FEW))
                break
            if off:
                problems.append(Problem(
                    f"step {k}: {off[0]} was gathered {_times(counts[off[0]])} in a step of {m} micro-batches; FSDP "
                    f"gathers a layer for each micro-batch's forward and again for its backward ({2 * m})", rank=r))
                break
            if scatters != len(layers) * m:
                problems.append(Problem(
                    f"step {k}: the stage's {len(layers)} blocks reduce-scattered {_times(scatters)} in a step of {m} "
                    f"micro-batches; each block's backward reduce-scatters its gradient once ({len(layers) * m} in "
                    f"all)", rank=r))
                break
    return problems


def _times(k: int) -> str:
    return {0: "never", 1: "once", 2: "twice"}.get(k, f"{k} times")


def judge_run(outcome) -> dict[str, list[Problem]]:
    memory = memory_problems(outcome)
    return {"values": value_problems(outcome),
            "memory": memory + hidden_problems(outcome, skip={p.rank for p in memory}),
            "counts": count_problems(outcome, kept_ranks={p.rank for p in memory if p.gist.startswith(KEPT)})
            + wire.byte_problems(outcome)}
