"""Parent side of q21 (sharded_adamw_step): judge what the ranks of a "zero" case recorded (kind.py).

Three parts, read from behaviour, never from the answer's form:
    values     every replica's parameters after each step equal one process's `torch.optim.AdamW` on the whole
               model and the global batch (computed here); a rank is charged for its first wrong step
    memory     the tensors the answer's `state` holds are those of one shard (AdamW's two moments for about N/n
               elements), not of the whole stage; no gradient is left held after the step (ZeRO-2); and which
               elements they are: after the first step, a moment of the contract's shard (torch.tensor_split's
               shard dp.rank), else the shard whose moments they are is named (shard r + 1: q19's reduce-scatter
               as it is; torch.chunk's shard r: other sizes where N % n != 0). The parameters that come out cannot
               tell: every rank's shard is gathered back, whichever shard each rank stepped.
    messages   no collective; every message to the ring's next position or from its previous one; per step at
               most 2(n - 1) sends, about 2(n - 1)/n of the stage's parameters' bytes (a reduce-scatter and an
               all-gather: as much as one all-reduce of the gradients)
"""
from __future__ import annotations

import functools
import itertools

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.problems import Problem, first_wrong_steps
from lab_src.topics.sharding.records import BETAS, EPS, WEIGHT_DECAY, chunk_bounds, shard_bounds

SLACK_BYTES = 1024          # a step count and the like, beside the two moments
# The rank's tensors beyond the parameters, gradients, `state` and the lab's records, after a step (kind.py's scan,
# harness/live.py). Measured with the reference on the four hidden cases, 3 runs, every rank and step: 0 to 1,936 B
# (the lab's last small tensors, such as a first stage's token ids); a stage's whole moments are at least 2 x 7,487
# x 4 B = 59,896 B more than its shard's in these cases. 16 KiB: eight times the noise, a quarter of the smallest.
HIDDEN_SLACK_BYTES = 16 * 1024
# AdamW divides each gradient element by its own running magnitude: where a gradient is nearly zero (the key
# projection's bias, whose gradient is exactly zero in exact arithmetic), float rounding in the order the replicas'
# micro-batches are summed decides an update of up to a small fraction of lr. A step's parameters are held to
# 1% of lr per step taken (a wrong shard, a missing bias correction or L2 in place of decoupled weight decay move
# elements by about lr), on top of float32's own tolerance.
LR_SHARE = 0.01


def close_after(got: torch.Tensor, want: torch.Tensor, steps: int, lr: float) -> bool:
    if got.shape != want.shape:
        return False
    return bool(torch.allclose(got.double(), want.double(), rtol=1e-5, atol=1e-6 + LR_SHARE * lr * steps))


def off_elements(got: torch.Tensor, want: torch.Tensor, steps: int, lr: float) -> int:
    """How many elements of `got` are not `close_after` `want`'s (all of them where the shapes differ)."""
    if got.shape != want.shape:
        return got.numel()
    return int((~torch.isclose(got.double(), want.double(), rtol=1e-5, atol=1e-6 + LR_SHARE * lr * steps)).sum())


@functools.lru_cache(maxsize=32)
def _one_process(cfg_items: tuple, steps: int, lr: float, betas: tuple = BETAS, eps: float = EPS,
                 weight_decay: float = WEIGHT_DECAY) -> list[dict]:
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    cfg = LabConfig(**dict(cfg_items))
    model = build_model(cfg, "cpu")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    out = [{n: p.detach().clone() for n, p in model.named_parameters()}]       # before the first step
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        model(batch).mean().backward()
        opt.step()
        out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


@functools.lru_cache(maxsize=16)
def _adam_l2_first_step(cfg_items: tuple, lr: float, betas: tuple, eps: float, weight_decay: float) -> dict:
    """One process's parameters after one step of Adam with the weight decay added to the gradient (L2:
    torch.optim.Adam's weight_decay), the alternative a wrong first step is compared with."""
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    cfg = LabConfig(**dict(cfg_items))
    model = build_model(cfg, "cpu")
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    model(batch).mean().backward()
    opt.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def adam_l2_first_step(case) -> dict:
    from lab_src.harness.baselines import threads_of_a_rank
    with threads_of_a_rank():
        s = settings_of(case)
        return _adam_l2_first_step(tuple(sorted(case.config.to_dict().items())), s.lr, *s.adamw().values())


@functools.lru_cache(maxsize=16)
def _first_gradients(cfg_items: tuple) -> dict:
    from lab_src.pipeline.config import LabConfig
    from lab_src.pipeline.data import make_dataloader
    from lab_src.pipeline.model import build_model
    cfg = LabConfig(**dict(cfg_items))
    model = build_model(cfg, "cpu")
    batch = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
    model(batch).mean().backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def first_gradients(case) -> dict:
    """One process's gradient of the first step, {name: tensor}: the replicas' average that the first step's
    reduce-scatter makes, so AdamW's first moments are (1 - beta1) times it."""
    from lab_src.harness.baselines import threads_of_a_rank
    with threads_of_a_rank():
        return _first_gradients(tuple(sorted(case.config.to_dict().items())))


def one_process(case, **adamw) -> list[dict]:
    """One process's parameters: [before the first step, after step 0, after step 1, ...], with the case's AdamW
    settings (`adamw`: some of them replaced, for the alternatives a wrong step is compared with)."""
    from lab_src.harness.baselines import threads_of_a_rank
    s = settings_of(case)
    with threads_of_a_rank():
        return _one_process(tuple(sorted(case.config.to_dict().items())), s.steps, s.lr,
                            *{**s.adamw(), **adamw}.values())


def first_step_factor(t: int, betas: tuple = BETAS) -> float:
    """What AdamW's first update of an element (|gradient| >> eps) is, in units of lr, when its bias correction
    takes the step count t: (1 - b1) / (1 - b1^t) * sqrt((1 - b2^t) / (1 - b2)); 1 for the right t = 1."""
    b1, b2 = betas
    return (1 - b1) / (1 - b1 ** t) * ((1 - b2 ** t) / (1 - b2)) ** 0.5


def first_step_ratio(got: dict, want: dict, before: dict, lr: float) -> float | None:
    """The median over the clearly-updated elements (AdamW moved them by over half of lr) of the answer's first
    update over AdamW's, None where too few were: a bias correction that took the wrong step count scales every
    such update by first_step_factor(t)."""
    ratios = []
    for name, g in got.items():
        if name not in want or g.shape != want[name].shape:
            continue
        d_want = (want[name] - before[name]).double().reshape(-1)
        d_got = (g - before[name]).double().reshape(-1)
        clear = d_want.abs() > 0.5 * lr
        ratios.append(d_got[clear] / d_want[clear])
    every = torch.cat(ratios) if ratios else torch.empty(0)
    return float(every.median()) if every.numel() >= 16 else None


# What a wrong first step is, where the data name it (`gist`: the same mistake said once, with the places it also
# showed, however the ranks' parameters and the cases differ: judge/summary.py)
SHIFT, L2 = "q21: the reduce-scatter left another chunk whole", "q21: L2 decay in the gradient"
IGNORED = "q21: AdamW's settings not taken from the arguments"


def value_problems(outcome) -> list[Problem]:
    before, *want_steps = one_process(outcome.case)
    lr = settings_of(outcome.case).lr
    first: dict[int, tuple[int, Problem]] = {}
    for r, o in sorted(outcome.obs.items()):
        for k, step in enumerate(o.get("steps") or []):
            got = step.get("params") or {}
            wrong = [n for n in got if n in want_steps[k] and not close_after(got[n], want_steps[k][n], k + 1, lr)]
            if not wrong:
                continue
            g = torch.cat([got[n].reshape(-1).double() for n in wrong])
            w = torch.cat([want_steps[k][n].reshape(-1).double() for n in wrong])
            differ = (f"{len(wrong)} of {len(got)} parameters differ from one process's AdamW "
                      f"({', '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}; largest difference "
                      f"{float((g - w).abs().max()):.3g})")
            named = (shift_problem(outcome, r, differ) or l2_problem(outcome, r, got, differ)
                     or ignored_problem(outcome, r, got, differ)) if k == 0 else None
            why = hint(k, got, want_steps, before, settings_of(outcome.case)) if named is None else ""
            first[r] = (k, named or Problem(f"after step {k}, {differ}{why}", rank=r, gist=f"q21 step {k}{why}"))
            break
    return first_wrong_steps(first, lambda k, earliest, cause: (
        f"after step {k} the parameters differ, step {earliest}'s having been right on this rank: another rank's "
        f"wrong step {earliest} reached them through the all-gather"))


def ring_contributions(n: int, shift: int) -> list[list[set]]:
    """[position][chunk]: the positions whose gradients each chunk holds the sum of after a ring reduce-scatter of
    n - 1 steps in which position r sends chunk (r - s - shift) mod n at step s and adds what arrives into the
    chunk before it. shift 0 is q19's (rank r ends with chunk r + 1 whole), 1 the contract's (chunk r)."""
    chunks = [[{p} for _ in range(n)] for p in range(n)]
    for s in range(n - 1):
        sent = [(p, (p - s - shift) % n, set(chunks[p][(p - s - shift) % n])) for p in range(n)]
        for p, c, got in sent:
            chunks[(p + 1) % n][c] |= got
    return chunks


def shift_problem(outcome, r: int, differ: str) -> Problem | None:
    """Where rank r's first step updated its own shard with what q19's reduce-scatter as it is leaves in it: its
    chunk r, summed over some replicas only (the ring left chunk r + 1 whole), or chunk r + 1 itself, whole. Read
    from the moments its state holds after the first step against the group's recorded own gradients."""
    o = outcome.obs[r]
    ring = o.get("dp_group") or [r]
    n, me = len(ring), ring.index(r)
    steps = o.get("steps") or []
    values = steps[0].get("state_values") if steps else None
    owns = [outcome.obs[g].get("own_grad") if g in outcome.obs else None for g in ring]
    if n == 1 or not values or any(not isinstance(x, torch.Tensor) for x in owns) or \
            len({x.numel() for x in owns}) != 1:
        return None
    owns = [x.reshape(-1).double() for x in owns]
    betas = settings_of(outcome.case).betas
    total = owns[0].numel()
    own = shard_bounds(total, n, me)
    whole = sum(owns) / n
    held = (me + 1) % n
    contributors = ring_contributions(n, 0)[me][me]
    partial = sum(owns[j] for j in sorted(contributors)) / n
    head = (f"q19's reduce-scatter as it is: it leaves rank r with chunk r + 1 whole (the hint's warning), and this "
            f"rank (position {me} of the data-parallel group of {n}) ended holding chunk {held} summed over all {n} "
            f"replicas, ")
    if len(contributors) < n and _moment_of(values, partial, own, betas):
        who = ("only its own replica's gradient" if contributors == {me} else
               f"the gradients of {len(contributors)} of the {n} replicas (positions "
               f"{', '.join(map(str, sorted(contributors)))})")
        what = (f"but it updated shard {me} with its chunk {me}, which holds {who}: the ring never added the others' "
                f"into it. Its AdamW state holds the moments of that partial sum")
    elif shard_bounds(total, n, held)[1] - shard_bounds(total, n, held)[0] == own[1] - own[0] and \
            _moment_of(values, whole, shard_bounds(total, n, held), betas):
        what = (f"and it updated shard {me}'s parameters with that chunk's gradient: its AdamW state holds the "
                f"moments of shard {held}'s elements, applied to shard {me}'s")
    else:
        return None
    return Problem(f"{head}{what}. Shift the ring by one so that each rank ends with its own shard whole: in step s "
                   f"rank r sends chunk (r - s - 1) mod n and adds what arrives into chunk (r - s - 2) mod n.\n"
                   f"    So after step 0, {differ}: the all-gather passes each rank's wrongly updated shard to every "
                   f"replica", rank=r, gist=SHIFT)


def l2_problem(outcome, r: int, got: dict, differ: str) -> Problem | None:
    """Where rank r's first step is Adam's with the weight decay added to the gradient (L2), not AdamW's decoupled
    decay: its parameters after the first step against one process's torch.optim.Adam with the case's settings."""
    lr = settings_of(outcome.case).lr
    want = adam_l2_first_step(outcome.case)
    names = [n for n in got if n in want]
    if not names or any(got[n].shape != want[n].shape for n in names):
        return None
    adamw = one_process(outcome.case)[1]
    off_l2 = sum(off_elements(got[n], want[n], 1, lr) for n in names)
    off_adamw = sum(off_elements(got[n], adamw[n], 1, lr) for n in names if n in adamw)
    # every element as Adam with L2 gives it, but for a rounding's few (an element whose g + 0.01 p is nearly zero
    # moves by up to lr either way, as the replicas' sums are added: 1 of 3,072 in a case here)
    if not off_adamw or off_l2 > 0.01 * off_adamw:
        return None
    apart = f"{off_l2} element{'s' if off_l2 != 1 else ''} apart from them, against {off_adamw:,} from AdamW's"
    wd = settings_of(outcome.case).weight_decay
    return Problem(f"the weight decay was added to the gradient (Adam's L2 decay, g + {wd:g} p), not "
                   f"decoupled as AdamW does it: after step 0 this rank's parameters are one process's "
                   f"torch.optim.Adam(weight_decay={wd:g})'s ({apart}). AdamW multiplies p by 1 - lr * "
                   f"{wd:g} first and never touches g: folded into g, the decay is divided by sqrt(v) with "
                   f"the gradient, lost where the gradient is large and a step of lr where it is small.\n"
                   f"    So after step 0, {differ}", rank=r, gist=L2)


def ignored_problem(outcome, r: int, got: dict, differ: str) -> Problem | None:
    """Where rank r's first step is one process's AdamW with some of its settings (betas, eps, weight_decay) left at
    torch's defaults instead of the case's: an answer that wrote the constants in, not taking its arguments. Each
    subset of the settings the case changed is tried; the closest is named where the step is that one's but for a
    rounding's few elements, as `l2_problem` judges. The betas do not show in a first step (its bias correction
    cancels them: m / (1 - b1) = g, v / (1 - b2) = g^2): a second step, where the rank took one, tells them."""
    s = settings_of(outcome.case)
    defaults = {"betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY}
    changed = [k for k, v in s.adamw().items() if v != defaults[k]]
    steps = [step.get("params") or {} for step in (outcome.obs[r].get("steps") or [])[:2]]
    right = one_process(outcome.case)
    names = [n for n in got if n in right[1] and got[n].shape == right[1][n].shape]
    if not changed or not names or not steps:
        return None

    def off(want: list[dict]) -> int:
        return sum(off_elements(params[n], want[k + 1][n], k + 1, s.lr)
                   for k, params in enumerate(steps) for n in names if n in params)
    off_right = off(right)
    subsets = [c for size in range(1, len(changed) + 1) for c in itertools.combinations(changed, size)]
    offs = {c: off(one_process(outcome.case, **{k: defaults[k] for k in c})) for c in subsets}
    # the closest, the fewest settings first among equals (eps alone moves only the elements whose gradient is about
    # as small as it: the key projection's bias)
    ignored = min(subsets, key=lambda c: (offs[c], len(c)))
    if not off_right or offs[ignored] > 0.01 * off_right:
        return None
    said = ", ".join(f"{k} {s.adamw()[k]}" for k in ignored)
    default = ", ".join(f"{k}={defaults[k]}" for k in ignored)
    after = "step 0" if len(steps) == 1 else "steps 0 and 1"
    return Problem(f"AdamW's settings were not taken from the arguments: after {after} this rank's parameters are "
                   f"one process's AdamW with {default} (torch's defaults), where this case passed {said} "
                   f"({offs[ignored]} element{'s' if offs[ignored] != 1 else ''} apart from them, against "
                   f"{off_right:,} from the case's). sharded_adamw_step takes lr, betas, eps and weight_decay as "
                   f"torch.optim.AdamW does: use the ones it is given.\n    So after step 0, {differ}",
                   rank=r, gist=IGNORED)


def hint(k: int, got: dict, want_steps: list, before: dict, settings) -> str:
    lr, (b1, b2) = settings.lr, settings.betas
    if k == 0:
        ratio = first_step_ratio(got, want_steps[0], before, lr)
        t = next((t for t in range(2, 101) if ratio is not None and
                  abs(ratio - first_step_factor(t, settings.betas)) < 0.02), None)
        if t is not None:
            return (f": the first step moved the parameters by {ratio:.2f} of AdamW's first step, what the bias "
                    f"correction gives with the step count t = {t} (1 - {b1:g}^{t}, 1 - {b2:g}^{t}) instead of 1: the "
                    f"count went up {t} times in one call; it counts optimizer steps, one per call of "
                    f"sharded_adamw_step, whatever the number of shards or messages")
        return (": the first step of AdamW moves every element by about lr (its update is m / (sqrt(v) + eps) "
                "after bias correction), so a wrong element is usually a wrong shard: check that shard i holds "
                "the elements torch.tensor_split gives it (uneven sizes: the first N % n shards one longer), the "
                f"bias correction, and the weight decay: decoupled, p *= 1 - lr * {settings.weight_decay:g}, never added "
                f"to the gradient")
    return (f": step 0 was right, so look at what carries over: the step count of the bias correction "
            f"(1 - beta ** t with t = {k + 1} now) and the moments kept in `state`")


def memory_problems(outcome, skip_layout=()) -> list[Problem]:
    """The state's bytes, the gradients left, what stayed alive outside `state`, and (but for the ranks in
    `skip_layout`, whose wrong values already name the shard they stepped) which elements the state is of."""
    problems = []
    for r, o in sorted(outcome.obs.items()):
        n = len(o.get("dp_group") or [0])
        total, elem = o.get("elements", 0), o.get("element_size", 4)
        start, end = shard_bounds(total, n, (o.get("dp_group") or [r]).index(r))
        allowed = 2 * (end - start) * elem + SLACK_BYTES
        for k, step in enumerate(o.get("steps") or []):
            held = step.get("state_bytes", 0)
            hidden = hidden_problem(k, step, r, n, total, elem, end - start)
            if hidden is not None and held <= allowed:
                problems.append(hidden)
                break
            if held > allowed:
                whole = 2 * total * elem
                what = ("AdamW's two moments for every element of the stage: the whole state, on every rank"
                        if held >= 0.9 * whole else f"{held / (2 * elem * total):.2f} of the whole state")
                problems.append(Problem(
                    f"step {k}: `state` holds {held:,} B, {what}; the rank's shard is {end - start:,} of the "
                    f"stage's {total:,} elements, so its moments are {2 * (end - start) * elem:,} B (1/{n} of "
                    f"{whole:,} B)", rank=r))
                break
            if step.get("grad_bytes"):
                problems.append(Problem(
                    f"step {k}: {step['grad_bytes']:,} B of gradients are still held after the step: ZeRO-2 keeps "
                    f"only the rank's shard of the reduced gradient, and frees the full gradients (p.grad = None) "
                    f"once they are reduce-scattered", rank=r))
                break
        else:
            layout = layout_problem(outcome, r, o) if r not in skip_layout else None
            if layout is not None:
                problems.append(layout)
    return problems


def _moment_of(values: list, grad: torch.Tensor, bounds: tuple[int, int], betas: tuple = BETAS) -> bool:
    """Whether one of `values` (the state's tensors) is AdamW's first or second moment, after one step, of the
    elements [start, end) of the flat gradient `grad`."""
    g = grad[bounds[0]:bounds[1]]
    for want in ((1 - betas[0]) * g, (1 - betas[1]) * g * g):
        scale = float(want.abs().max()) if want.numel() else 0.0
        for v in values:
            if v.numel() == want.numel() and want.numel() and \
                    float((v.double() - want).abs().max()) <= 1e-3 * scale + 1e-30:
                return True
    return False


def layout_problem(outcome, r: int, o: dict) -> Problem | None:
    """Which elements the rank's state holds moments of, after the first step: None where they are its own shard's
    (torch.tensor_split's shard dp.rank), or where they are none that a known layout would give (the values and
    the memory judged above speak for those); else the layout, named."""
    steps = o.get("steps") or []
    values = steps[0].get("state_values") if steps else None
    names = list((steps[0].get("params") or {}) if steps else [])
    if not values or not names:
        return None
    grads = first_gradients(outcome.case)
    if not all(n in grads for n in names):
        return None
    grad = torch.cat([grads[n].reshape(-1).double() for n in names])
    betas = settings_of(outcome.case).betas
    ring = o.get("dp_group") or [r]
    n, me, total = len(ring), ring.index(r), grad.numel()
    own = shard_bounds(total, n, me)
    if n == 1 or _moment_of(values, grad, own, betas):
        return None
    contract = (f"the contract's shard {me} is torch.tensor_split's: elements {own[0]:,} to {own[1] - 1:,} of the "
                f"{total:,} (the first N % n = {total % n} shards one element longer)")
    chunk = chunk_bounds(total, n, me)
    if chunk != own and _moment_of(values, grad, chunk, betas):
        return Problem(f"the shards were cut with torch.chunk: this rank's AdamW state holds the moments of elements "
                       f"{chunk[0]:,} to {chunk[1] - 1:,}, torch.chunk's piece {me} (ceil(N / n) = {-(-total // n):,} "
                       f"elements each, the last shorter); {contract}. The parameters still come out right, but the "
                       f"shards differ from the contract's, and from every other ZeRO implementation's that the "
                       f"rank's state would be saved or loaded with", rank=r)
    for j in range(n):
        if j != me and _moment_of(values, grad, shard_bounds(total, n, j), betas):
            cause = ("q19's ring as it is: its reduce-scatter leaves rank r with chunk r + 1 whole, and this rank "
                     if j == (me + 1) % n else "this rank ")
            fix = (" Arrange the ring's steps so that each rank ends with its own shard (send chunk r - s - 1 at "
                   "step s)." if j == (me + 1) % n else "")
            return Problem(f"{cause}(position {me} of the data-parallel group) steps shard {j}, not shard {me}: its "
                           f"AdamW state holds the moments of shard {j}'s elements, and the rank at position dp.rank "
                           f"owns shard dp.rank.{fix} The parameters still come out right (every shard is gathered "
                           f"back), but no rank holds the state the contract gives it", rank=r)
    return None


def hidden_problem(k: int, step: dict, r: int, n: int, total: int, elem: int, mine: int) -> Problem | None:
    """The tensors the rank held after step k outside `state` (and beyond the parameters, the gradients and the
    lab's own), where they exceed the noise: AdamW's state kept where `state` does not show it."""
    hidden = step.get("hidden_bytes", 0)
    if hidden <= HIDDEN_SLACK_BYTES:
        return None
    whole = 2 * total * elem
    what = ("as much as AdamW's two moments for every element of the stage: the whole state, on every rank"
            if hidden >= 0.9 * whole else f"{hidden / whole:.2f} of AdamW's whole state for the stage")
    return Problem(
        f"step {k}: this rank held {hidden:,} B of tensors beyond its shard's state after the step, {what} "
        f"(2 moments x {total:,} elements x {elem} B = {whole:,} B); `state` holds {step.get('state_bytes', 0):,} "
        f"B, and the rest stayed alive outside it (a module global, a closure, an attribute of an object): the lab "
        f"counts every tensor the rank keeps, wherever it is. The rank's shard is {mine:,} of the stage's {total:,} "
        f"elements, so "
        f"its moments are {2 * mine * elem:,} B (1/{n} of {whole:,} B), kept in `state` and nowhere else", rank=r)


def message_problems(outcome) -> list[Problem]:
    problems = []
    for r, o in sorted(outcome.obs.items()):
        ring = o.get("dp_group") or [r]
        n = len(ring)
        pos = ring.index(r)
        total, elem = o.get("elements", 0), o.get("element_size", 4)
        nxt, prev = ring[(pos + 1) % n], ring[(pos - 1) % n]
        low = 2 * (n - 1) * (total // n) * elem
        high = 2 * (n - 1) * -(-total // n) * elem
        for k, step in enumerate(o.get("steps") or []):
            if step.get("collectives"):
                problems.append(Problem(f"step {k}: a collective of torch.distributed ({step['collectives'][0]}): "
                                        f"only point-to-point messages in a ring", rank=r))
                break
            sends, recvs = step.get("sends") or [], step.get("recvs") or []
            bad = [p for p, _ in sends if p != nxt] + [p for p, _ in recvs if p != prev]
            if bad:
                problems.append(Problem(f"step {k}: a message with rank {bad[0]}; in this ring rank {r} sends to "
                                        f"rank {nxt} and receives from rank {prev} only", rank=r))
                break
            sent = sum(b for _, b in sends)
            if n > 1 and not low <= sent <= high:
                ratio = sent / (total * elem)
                why = (" (3(n - 1)/n: an all-reduce of the gradients and then an all-gather; a reduce-scatter "
                       "is enough, since each rank steps only its shard)" if abs(ratio - 3 * (n - 1) / n) < 0.05
                       else "")
                problems.append(Problem(
                    f"step {k}: rank {r} sent {sent:,} B in {len(sends)} messages, {ratio:.2f} of the stage's "
                    f"{total * elem:,} B of parameters; a reduce-scatter of the gradients and an all-gather of the "
                    f"parameters send 2(n - 1)/n = {2 * (n - 1) / n:.2f} of it, in 2(n - 1) = {2 * (n - 1)} "
                    f"messages{why}", rank=r))
                break
    return problems


def judge_run(outcome) -> dict[str, list[Problem]]:
    values = value_problems(outcome)
    return {"values": values, "memory": memory_problems(outcome, {p.rank for p in values if p.gist == SHIFT}),
            "messages": message_problems(outcome) + wire.byte_problems(outcome)}
