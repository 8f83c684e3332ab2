"""Parent side of q25 (dispatch, with route, combine and sync_gradients): judge what the ranks of a "moe" case recorded
(kind.py) against one process's MoE run here (moe.py `one_process_run`), from behaviour only, part by part:

    forward     each rank's logits of step 0 are one process's for its rows; where they are not, its first layer's
                combine is read: the outputs unweighted (combine without the router's weights), the right rows in
                other places (tokens returned in another order than they left)
    gradients   every parameter's gradient after the answer's sync_gradients is one process's; a consistent factor
                on the experts' (or the dense parameters') is named: ep (not divided for the ep ranks whose terms the
                all-to-all's backward summed), 1/ep (divided twice), dp * ep (summed, never divided)
    training    the ranks' mean loss over three SGD steps is one process's curve
    traffic     per MoE layer, the forward holds one all-to-all of counts (integers) and two of tokens, the backward two
                of tokens and none of counts; the rows they send off-rank (the lab's record of their split sizes,
                comm/collectives.py ALL_TO_ALL) are exactly the kept assignments the rule sends off-rank, and back
    routing     the assignments route kept (each layer) are the rule's: how many were dropped, and which

The rule is not in the student package (it is q25's route): judge_run takes it. The hidden tests bring the grader's
(grader/hidden/q25_dispatch.py route_rule) and compare the routing with it; the visible check brings the answer's own
route, holds what it returned on the run to the rule's properties (routing_properties: checked, not computed), and
judges the other parts against one process routed as the answer routes.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.topics.experts.records import ITEMSIZE, PARTS, capacity

TOLERANCE = {"float64": 1e-9, "float32": 2e-4}


@functools.lru_cache(maxsize=16)
def _reference(cfg_items: tuple, settings_items: tuple, ranks: int, route) -> dict:
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.experts.moe import one_process_run
    from lab_src.topics.experts.records import MoeSettings
    return one_process_run(LabConfig(**dict(cfg_items)), MoeSettings(**dict(settings_items)), ranks, route)


def reference_run(outcome, route) -> dict:
    """One process's run of the case (moe.py one_process_run) with `route` as the rule."""
    cfg, settings = outcome.case.config, settings_of(outcome.case)
    return _reference(tuple(sorted(cfg.to_dict().items())), tuple(sorted(settings.to_dict().items())),
                      outcome.case.stages, route)


@functools.lru_cache(maxsize=16)
def _fresh_model(cfg_items: tuple, settings_items: tuple):
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.experts.moe import MoeModel, starved_experts
    from lab_src.topics.experts.records import MoeSettings
    s = MoeSettings(**dict(settings_items))
    return MoeModel(LabConfig(**dict(cfg_items)), s.experts, range(s.experts), s.dtype, starved_experts(s))


def fresh_model(outcome):
    cfg, settings = outcome.case.config, settings_of(outcome.case)
    return _fresh_model(tuple(sorted(cfg.to_dict().items())), tuple(sorted(settings.to_dict().items())))


def close(got, want, dtype: str) -> bool:
    if not isinstance(got, torch.Tensor) or want is None or tuple(got.shape) != tuple(want.shape):
        return False
    return difference(got, want) <= TOLERANCE[dtype] * max(1.0, want.double().abs().max().item())


def difference(got, want) -> float:
    if got.numel() == 0:
        return 0.0
    return (got.double() - want.double()).abs().max().item()


def forward_problems(outcome, ref: dict, settings, rules: dict) -> list[Problem]:
    problems = []
    b = settings.batch
    for r, o in sorted(outcome.obs.items()):
        want = ref["logits"][r * b:(r + 1) * b]
        got = o.get("logits")
        if close(got, want, settings.dtype):
            continue
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            problems.append(Problem(f"the logits of this rank's rows are {getattr(got, 'shape', got)}, one process's "
                                    f"{tuple(want.shape)}", rank=r))
            continue
        problems.append(Problem(f"the logits of this rank's rows differ from one process's MoE by "
                                f"{difference(got, want):.3g}{combine_diagnosis(outcome, rules, settings, r, o)}",
                                rank=r))
    return problems


def rule_layers(outcome, settings, route) -> dict:
    """{(rank, layer): (the rule's routing of the inputs the rank's layer got, the combine one process computes from
    them)}: the rule and the experts at step 0 (the model as built), applied to what each rank recorded, so that a
    layer is judged on its own inputs, whatever came before it."""
    from lab_src.topics.experts.moe import one_process_moe
    model = fresh_model(outcome)
    out = {}
    for r, o in sorted(outcome.obs.items()):
        for i, rec in enumerate(o.get("moe_layers") or []):
            x = rec.get("x")
            if not isinstance(x, torch.Tensor) or i >= len(model.blocks):
                continue
            with torch.no_grad():
                block = model.blocks[i]
                routing = route(x, block.router, settings.k, settings.capacity_factor)
                out[(r, i)] = (routing, one_process_moe(block, x, routing), block)
    return out


def combine_diagnosis(outcome, rules: dict, settings, r: int, o: dict) -> str:
    """The first MoE layer whose combine differs from one process's on its own inputs, and how."""
    from lab_src.topics.experts.moe import one_process_moe
    for i, rec in enumerate(o.get("moe_layers") or []):
        if (r, i) not in rules:
            return ""
        routing, want, block = rules[(r, i)]
        got = rec.get("combined")
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
            return f": layer {i}'s combine returned {getattr(got, 'shape', type(got).__name__)}, not {tuple(want.shape)}"
        if close(got, want, settings.dtype):
            continue
        x = rec["x"]
        with torch.no_grad():
            unweighted = one_process_moe(block, x, routing, weighted=False)
        if close(got, unweighted, settings.dtype):
            return (f": layer {i}'s combine returns the experts' outputs summed without the router's weights; each "
                    f"token's output is the sum over its kept experts of weight * output (the weights are also how the "
                    f"router learns)")
        if permuted(got, want, settings.dtype) or close(got.sum(0), want.sum(0), settings.dtype):
            return (f": layer {i}'s combine puts the right outputs in the wrong rows: each expert's output belongs to "
                    f"the token it came from (dispatch reordered the rows per expert: combine must add each back at "
                    f"its own token's index)")
        return f": layer {i}'s combine differs from one process's on the same inputs (by {difference(got, want):.3g})"
    return " (every MoE layer's combine is right on its inputs: the rest of the model differs)"


def permuted(got, want, dtype: str) -> bool:
    """Whether `got` holds `want`'s rows, each once, in another order."""
    if got.shape != want.shape or got.shape[0] < 2 or close(got, want, dtype):
        return False
    d = torch.cdist(got.double(), want.double())
    match = d.argmin(1)
    tol = TOLERANCE[dtype] * max(1.0, want.double().abs().max().item()) * 10
    return bool((d.min(1).values <= tol).all()) and len(set(match.tolist())) == got.shape[0]


def factor_of(pairs) -> float | None:
    """The one factor c with got = c * want over these (got, want) pairs, or None."""
    num = sum(float((g.double() * w.double()).sum()) for g, w in pairs)
    den = sum(float((w.double() * w.double()).sum()) for g, w in pairs)
    if den == 0:
        return None
    c = num / den
    worst = max(((g.double() - c * w.double()).abs().max().item() / max(1e-30, w.double().abs().max().item()))
                for g, w in pairs)
    return c if worst < 1e-6 else None


def factor_words(c: float, ep: int, dp: int, who: str) -> str:
    def near(v):
        return abs(c - v) <= 1e-6 * max(1.0, abs(v))
    if who == "experts":
        if near(ep) and ep > 1:
            return (f"{ep}x one process's (ep = {ep}): not divided by the expert-parallel size. The all-to-all's "
                    f"backward already summed the terms of the {ep} ranks whose tokens each expert saw: divide by "
                    f"ep as well as averaging over the dp group")
        if near(1 / ep) and ep > 1:
            return (f"1/{ep} of one process's (ep = {ep}): divided by the expert-parallel size twice (once is right: "
                    f"the all-to-all's backward summed the ep ranks' terms once)")
        if near(ep * dp) and dp > 1:
            return (f"{ep * dp}x one process's (ep x dp = {ep * dp}): summed over the dp group and never divided")
        if near(1 / dp) and dp > 1:
            return f"1/{dp} of one process's: averaged over the dp group where they should have been summed then divided"
    else:
        n = ep * dp
        if near(n) and n > 1:
            return f"{n}x one process's: summed over the {n} ranks and not divided (every rank holds its own tokens)"
        if near(ep) and ep > 1:
            return (f"{ep}x one process's: averaged over dp only, not over the ep ranks, which hold other tokens of "
                    f"the batch too")
        if near(1 / ep) and ep > 1:
            return f"1/{ep} of one process's: divided by ep once too often"
    return f"{c:.4g}x one process's"


def gradient_problems(outcome, ref: dict, settings, forward_wrong: bool) -> list[Problem]:
    problems = []
    ep, dp = settings.ep, outcome.case.stages // settings.ep
    for r, o in sorted(outcome.obs.items()):
        grads = o.get("grads") or {}
        wrong = {"experts": [], "dense": []}
        for name, got in grads.items():
            want = ref["grads"].get(name)
            if want is None:
                continue
            if not close(got, want, settings.dtype):
                wrong["experts" if ".experts." in name else "dense"].append((name, got, want))
        if not wrong["experts"] and not wrong["dense"]:
            continue
        if forward_wrong:
            problems.append(Problem(f"{len(wrong['experts']) + len(wrong['dense'])} of {len(grads)} gradients differ "
                                    f"from one process's (the forward already does)", rank=r))
            continue
        for who, bad in wrong.items():
            if not bad:
                continue
            pairs = [(g, w) for _, g, w in bad if isinstance(g, torch.Tensor) and g.shape == w.shape]
            c = factor_of(pairs) if len(pairs) == len(bad) else None
            what = "the experts' gradients" if who == "experts" else "the dense parameters' gradients (embedding, " \
                "attention, routers, head)"
            if c is not None:
                problems.append(Problem(f"{what} are {factor_words(c, ep, dp, who)} ({len(bad)} parameters, "
                                        f"{bad[0][0]} first)", rank=r))
            else:
                problems.append(Problem(f"{len(bad)} of {what} differ from one process's ({bad[0][0]} by "
                                        f"{difference(bad[0][1], bad[0][2]) if pairs else 'its shape'})", rank=r))
    return problems


def curve_problems(outcome, ref: dict, settings) -> list[Problem]:
    losses = [o.get("losses") or [] for _, o in sorted(outcome.obs.items())]
    if any(len(x) != settings.steps for x in losses):
        return [Problem(f"the ranks recorded {[len(x) for x in losses]} losses, not {settings.steps} each")]
    for k in range(settings.steps):
        got = sum(x[k] for x in losses) / len(losses)
        want = ref["losses"][k]
        if not abs(got - want) <= TOLERANCE[settings.dtype] * max(1.0, abs(want)):
            return [Problem(f"step {k}: the ranks' mean loss is {got:.10f}, one process's {want:.10f}: the curve leaves "
                            f"one process's there")]
    return []


def expected_rows(outcome, rules: dict, settings, r: int) -> list[tuple[int, int]]:
    """Per MoE layer, (rows rank r's dispatch sends off-rank, rows its combine sends off-rank), by the rule applied to
    the inputs each rank of r's ep group recorded."""
    ep, E = settings.ep, settings.experts
    L = E // ep
    dp_rank, me = divmod(r, ep)
    members = [dp_rank * ep + j for j in range(ep)]
    out = []
    for layer in range(outcome.case.config.num_layers):
        def sent(src: int, dst_ep: int, layer: int = layer) -> int:
            if (src, layer) not in rules:
                return 0
            routing = rules[(src, layer)][0]
            return int(((routing.experts // L == dst_ep) & routing.keep).sum())
        dispatch = sum(sent(r, j) for j in range(ep) if j != me)
        combine = sum(sent(members[j], me) for j in range(ep) if j != me)
        out.append((dispatch, combine))
    return out


def off_rank(record: dict, rank: int) -> int:
    members = record.get("members") or []
    me = members.index(rank) if rank in members else -1
    return sum(n for j, n in enumerate(record.get("in") or []) if j != me)


def traffic_problems(outcome, rules: dict, settings) -> list[Problem]:
    problems = []
    cfg = outcome.case.config
    layers = cfg.num_layers
    row_bytes = cfg.hidden_size * ITEMSIZE[settings.dtype]
    for r, o in sorted(outcome.obs.items()):
        a2a = o.get("a2a") or {}
        fwd, bwd = a2a.get("forward") or [], a2a.get("backward") or []
        def tokens(a) -> bool:          # rows of h elements of the model's dtype; anything else is counts
            return not a["integer"] and a["row_bytes"] == row_bytes
        counts = [a for a in fwd if not tokens(a)]
        fwd_rows, bwd_rows = [a for a in fwd if tokens(a)], [a for a in bwd if tokens(a)]
        said = []
        if not fwd and not bwd:
            problems.append(Problem("the lab recorded no all-to-all on this rank: exchange the counts and the tokens "
                                    "with torch.distributed.all_to_all_single over ep_group (the lab records those "
                                    "calls; torch's functional collectives it does not see)", rank=r))
            continue
        if len(counts) != layers:
            said.append(f"{len(counts)} all-to-alls of counts (integers) in the forward of {layers} MoE layers, not one "
                        f"per layer" + (": without the counts a rank cannot size what it receives; exchange them in "
                                        "one all-to-all a layer (not padded to a fixed size, not gathered from every "
                                        "rank)" if not counts else ""))
        if not fwd_rows and not bwd_rows:
            problems += [Problem(x, rank=r) for x in said] + [Problem(
                "the lab recorded no all-to-all of tokens on this rank, forward or backward: send them with "
                "torch.distributed.all_to_all_single (in an autograd.Function whose backward is the reverse "
                "all-to-all); torch's functional collectives (all_to_all_single_autograd) are not recorded, so "
                "nothing vouches for what they sent", rank=r)]
            continue
        if len(fwd_rows) != 2 * layers:
            said.append(f"{len(fwd_rows)} all-to-alls of tokens in the forward of {layers} MoE layers, not two per "
                        f"layer (dispatch and combine)")
        if len(bwd_rows) != 2 * layers or len(bwd) != len(bwd_rows):
            said.append(f"{len(bwd_rows)} all-to-alls of tokens and {len(bwd) - len(bwd_rows)} of counts in the "
                        f"backward of {layers} MoE layers, not two per layer and none of counts (the backward reuses "
                        f"the forward's counts)")
        want = expected_rows(outcome, rules, settings, r)
        want_fwd = sum(d + c for d, c in want) * row_bytes
        got_fwd = sum(off_rank(a, r) * a["row_bytes"] for a in fwd_rows)
        got_bwd = sum(off_rank(a, r) * a["row_bytes"] for a in bwd_rows)
        if got_fwd != want_fwd:
            how = ("more: rows over capacity or padding were sent too" if got_fwd > want_fwd else "fewer")
            said.append(f"the forward's all-to-alls of tokens sent {got_fwd:,} B to other ranks; the assignments the "
                        f"rule keeps need {want_fwd:,} B ({', '.join(f'layer {i}: {d} + {c} rows' for i, (d, c) in enumerate(want))} "
                        f"of {row_bytes} B) {how}")
        if got_bwd != want_fwd and len(bwd_rows):
            said.append(f"the backward's all-to-alls of tokens sent {got_bwd:,} B to other ranks, not the "
                        f"forward's {want_fwd:,} B back")
        problems += [Problem(s, rank=r) for s in said]
    return problems


def token_major_keep(experts, k: int, E: int, cap: int):
    """The keep mask of capacity taken token by token (each token's choices in turn): the rule's usual misreading."""
    keep = torch.zeros(tuple(experts.shape), dtype=torch.bool)      # each assignment set below
    used = [0] * E
    for t in range(experts.shape[0]):
        for j in range(k):
            e = int(experts[t, j])
            keep[t, j] = used[e] < cap
            used[e] += int(used[e] < cap)
    return keep


def routing_problems(outcome, rules: dict, settings) -> list[Problem]:
    problems = []
    T = settings.batch * outcome.case.config.seq_len
    cap = capacity(T, settings.k, settings.experts, settings.capacity_factor)
    for r, o in sorted(outcome.obs.items()):
        for i, rec in enumerate(o.get("moe_layers") or []):
            if (r, i) not in rules:
                break
            want = rules[(r, i)][0]
            keep, experts = rec.get("keep"), rec.get("experts")
            if not isinstance(keep, torch.Tensor) or tuple(keep.shape) != tuple(want.keep.shape):
                problems.append(Problem(f"layer {i}: route returned no keep mask of shape {tuple(want.keep.shape)} "
                                        f"(return Routing(experts, weights, keep, E))", rank=r))
                break
            if not isinstance(experts, torch.Tensor) or not torch.equal(experts.long(), want.experts):
                problems.append(Problem(f"layer {i}: route chose other experts than the top {settings.k} of the "
                                        f"router's softmax, first choice first", rank=r))
                break
            if torch.equal(keep.bool(), want.keep):
                continue
            got_n, want_n = int((~keep.bool()).sum()), int((~want.keep).sum())
            rule = (f"capacity {cap} per expert of this rank's {T} x {settings.k} assignments, every first choice in "
                    f"token order, then every second choice" if cap is not None else "no capacity: nothing is dropped")
            if cap is not None and torch.equal(keep.bool(), token_major_keep(want.experts, settings.k,
                                                                              settings.experts, cap)):
                msg = (f"layer {i}: route took the capacity token by token (each token's choices in turn); the rule "
                       f"takes every token's first choice before any second choice, so a token's first choice is "
                       f"never dropped for another token's second ({rule})")
            elif got_n == 0:
                msg = f"layer {i}: route dropped nothing; the rule drops {want_n} ({rule})"
            elif got_n != want_n:
                msg = f"layer {i}: route dropped {got_n} assignments; the rule drops {want_n} ({rule})"
            else:
                msg = f"layer {i}: route dropped {got_n} assignments, as many as the rule, but other ones ({rule})"
            problems.append(Problem(msg, rank=r))
            break
    return problems


def routing_properties(x, router, k: int, capacity_factor: float, experts, weights, keep) -> list[str]:
    """What a routing of `x` must show to be the rule's (q25's contract), checked, not computed: each token's k experts
    distinct and the top k of the router's probabilities, first choice first; the weights those probabilities; with a
    capacity, an assignment kept exactly where its expert had kept fewer than the capacity before it, in the rule's
    order (every first choice in token order, then every second). Where no two probabilities tie only the rule's
    routing shows all of them. Nothing: it does."""
    T, E = x.shape[0], router.out_features
    parts = {"experts": experts, "weights": weights, "keep": keep}
    for name, t in parts.items():
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != (T, k):
            return [f"route's {name} is {getattr(t, 'shape', type(t).__name__)}, not ({T}, {k}): one row a token, one "
                    f"column a choice (return Routing(experts, weights, keep, E))"]
    experts, keep = experts.long(), keep.bool()
    if bool(((experts < 0) | (experts >= E)).any()):
        return [f"route chose experts outside 0..{E - 1}"]
    with torch.no_grad():
        p = router(x).softmax(dim=-1)
    chosen = p.gather(1, experts)
    if k > 1 and bool((experts.sort(dim=1).values.diff(dim=1) == 0).any()):
        return ["route chose one expert twice for a token: each token's k experts are distinct"]
    others = p.scatter(1, experts, float("-inf")).max(dim=1).values if k < E else None
    if (others is not None and bool((others > chosen.min(dim=1).values).any())) or \
            bool((chosen.diff(dim=1) > 0).any()):
        return [f"route's experts are not each token's top {k} of the router's softmax, first choice first"]
    tol = 1e-9 if p.dtype == torch.float64 else 1e-5
    if not torch.allclose(weights.to(p.dtype), chosen, rtol=tol, atol=tol):
        if torch.allclose(weights.to(p.dtype), chosen / chosen.sum(dim=1, keepdim=True), rtol=tol, atol=tol):
            return ["route's weights are renormalised over the k choices; the rule keeps the softmax over all E "
                    "experts (the weights of a token then add up to less than 1)"]
        return ["route's weights are not the router's probabilities of the chosen experts (softmax over all E)"]
    cap = capacity(T, k, E, capacity_factor)
    if cap is None:
        return [] if bool(keep.all()) else [f"route dropped {int((~keep).sum())} assignments with no capacity set: "
                                            f"nothing is dropped"]
    order_e, order_keep = experts.t().reshape(-1), keep.t().reshape(-1)     # the rule's order: choice by choice
    kept = F.one_hot(order_e, E) * order_keep.unsqueeze(1)
    before = (kept.cumsum(0) - kept).gather(1, order_e.unsqueeze(1)).squeeze(1)   # kept earlier by the same expert
    if bool((order_keep & (before >= cap)).any()):
        return [f"route kept more than the capacity of {cap} assignments for an expert"]
    if bool((~order_keep & (before < cap)).any()):
        if bool(torch.equal(keep, token_major_keep(experts, k, E, cap))):
            return [f"route took the capacity token by token (each token's choices in turn); the rule takes every "
                    f"first choice in token order, then every second, so a token's first choice is never dropped "
                    f"for another token's second (capacity {cap})"]
        return [f"route dropped an assignment whose expert had kept fewer than its capacity of {cap} before it (in "
                f"the rule's order: every first choice in token order, then every second)"]
    return []


def property_problems(outcome, settings) -> list[Problem]:
    """Each rank's recorded routing of each layer, held to routing_properties on the layer's own inputs (the check's
    routing part where the judge has no rule of its own to compare with)."""
    model = fresh_model(outcome)
    problems = []
    for r, o in sorted(outcome.obs.items()):
        for i, rec in enumerate(o.get("moe_layers") or []):
            x = rec.get("x")
            if not isinstance(x, torch.Tensor) or i >= len(model.blocks):
                continue
            said = routing_properties(x, model.blocks[i].router, settings.k, settings.capacity_factor,
                                      rec.get("experts"), rec.get("weights"), rec.get("keep"))
            if said:
                problems.append(Problem(f"layer {i}: {said[0]}", rank=r))
                break
    return problems


def judge_run(outcome, route, rule: bool = True) -> dict[str, list[Problem]]:
    """Every part of a case. `route` is the rule one process runs: the grader's own (`rule`: routing compared with
    it), or, in the visible check, the answer's route (routing held to routing_properties, the rest judged against one
    process routing as the answer does, so that dispatch and combine are judged whatever route does)."""
    settings = settings_of(outcome.case)
    ref = reference_run(outcome, route)
    rules = rule_layers(outcome, settings, route)
    found = {part: [] for part in PARTS}
    found["forward"] = forward_problems(outcome, ref, settings, rules)
    found["gradients"] = gradient_problems(outcome, ref, settings, bool(found["forward"]))
    found["training"] = curve_problems(outcome, ref, settings)
    found["traffic"] = traffic_problems(outcome, rules, settings)
    found["routing"] = routing_problems(outcome, rules, settings) if rule else property_problems(outcome, settings)
    return found


def flat(found: dict) -> list[Problem]:
    return [p for part in PARTS for p in found[part]]
