"""The judge of q18's tensor-parallel block (the "tp_block" case kind, topics/tensor_parallel/kind_block.py).

What each rank should have got is computed here from the unsharded block of the case's configuration,
run once in this process on the inputs the seed draws (topics/tensor_parallel/runtime.py), with dropout drawn as
pipeline/dropout.py defines it for t shards. Per part ("block": dropout off; "dropout": on) and rank:

    numbers         the output, the input's gradient, every shard's weight and bias gradients (qkv by
                    heads, proj by its heads' columns, the MLP's up and down, the whole LayerNorms) against
                    the unsharded block's (float64 to 1e-10), and with dropout on the output in evaluation mode
                    too (nothing dropped; judged once the rest is right); with dropout on, a wrong output is read for its
                    cause: outputs that differ between the ranks mean the replicated region drew different
                    masks on different ranks; outputs equal on every rank but not the single process's mean the
                    masks inside the sharded region (the attention of each rank's heads) were not each
                    shard's own
    replicated      the LayerNorms' weights and biases after one AdamW step: identical on every rank (that
                    they are the single process's follows from their gradients, judged under numbers)
    communication   one all-reduce of the activation after the attention and one after the MLP in the forward,
                    one before each in the backward (kind, bytes, group); extra or missing rounds named
    holds           qkv (3h/t, h), proj (h, h/t), 1/t of the four matrices

`judge_part(part, outcome)` returns {"numbers", "replicated", "communication", "holds"} problems.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.pipeline.model import build_piece
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.judge_layers import KIND_WORDS, TOLERANCE, close, round_key, rounds_text
from lab_src.topics.tensor_parallel.records import BLOCK_WHAT, grid_members, part_config

WHAT = BLOCK_WHAT
GRADS = {"qkv": "qkv (column parallel by heads)", "proj": "proj (row parallel)", "up": "the MLP's up",
         "down": "the MLP's down", "attn_norm": "the attention's LayerNorm", "mlp_norm": "the MLP's LayerNorm"}
NORMS = ("attn_norm", "mlp_norm")
LR = 1e-2


@functools.lru_cache(maxsize=16)
def _full(part: str, cfg, t: int) -> dict:
    """The unsharded block's run: output, input gradient, parameter gradients, LayerNorms after AdamW."""
    block = build_piece(part_config(part, cfg, t), tpmod.BLOCK)
    data = tpmod.block_inputs(cfg)
    block.eval()
    with torch.no_grad():
        evaluated = block(data["x"])        # the lab's model draws no mask in evaluation mode
    block.train()
    x = data["x"].clone().requires_grad_()
    y = block(x)
    y.backward(data["grad"])
    grads = {n: q.grad.detach().clone() for n, q in block.named_parameters()}
    torch.optim.AdamW(block.parameters(), lr=LR).step()
    after = {n: q.detach().clone() for n, q in block.named_parameters() if n.split(".")[0] in NORMS}
    return {"out": y.detach(), "in_grad": x.grad.detach(), "grads": grads, "after": after, "block": block,
            "eval_out": evaluated}


def expected(part: str, cfg, t: int) -> list[dict]:
    """Per rank: the tensors it should record (keys as the rank records them) and its collectives."""
    full = _full(part, cfg, t)
    g, block = full["grads"], full["block"]
    h, heads = cfg.hidden_size, cfg.num_heads
    act = full["out"].numel() * full["out"].element_size()
    one = [["all_reduce", act, list(range(t))]] * 2
    shapes = {"qkv": [3 * h // t, h], "proj": [h, h // t], "up": [4 * h // t, h], "down": [h, 4 * h // t],
              "attn_norm": [h], "mlp_norm": [h]}
    params = (3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h) // t + h + h + 4 * h
    out = []
    for r in range(t):
        rows = tpmod.heads_rows(h, heads, r, t)
        want = {"out": full["out"], "in_grad": full["in_grad"], "eval_out": full["eval_out"],
                "qkv_weight_grad": g["qkv.weight"][rows], "qkv_bias_grad": g["qkv.bias"][rows],
                "proj_weight_grad": tpmod.shard(g["proj.weight"], r, t, 1), "proj_bias_grad": g["proj.bias"],
                "up_weight_grad": tpmod.shard(g["up.weight"], r, t, 0), "up_bias_grad": tpmod.shard(g["up.bias"], r, t, 0),
                "down_weight_grad": tpmod.shard(g["down.weight"], r, t, 1), "down_bias_grad": g["down.bias"],
                "fwd": one, "bwd": one, "params": params,
                "full_params": sum(q.numel() for q in block.parameters())}
        for key in NORMS:
            want[f"{key}_weight_grad"], want[f"{key}_bias_grad"] = g[f"{key}.weight"], g[f"{key}.bias"]
            want[f"{key}_weight_after"], want[f"{key}_bias_after"] = full["after"][f"{key}.weight"], \
                full["after"][f"{key}.bias"]
        want.update({f"{k}_weight_shape": v for k, v in shapes.items()})
        out.append(want)
    return out


def _name(key: str) -> str:
    if key == "out":
        return "the output"
    if key == "in_grad":
        return "the input's gradient"
    mod, what = key.rsplit("_", 2)[0], key.rsplit("_", 2)[1]
    return f"{GRADS[mod]}'s {what} gradient"


def numbers(part: str, k: int, t: int, got: dict, want: dict, tol: float, outs: list, rank: int | None = None,
            members: list | None = None, block_right: bool = True) -> list[Problem]:
    """The numbers of the rank that is its group's k-th (`outs`: its group's outputs, in that order); problems
    name `rank`, its global rank (k itself where the group is the case's first ranks). `block_right`: whether
    the block without dropout came out right; where it did not, a wrong dropout output follows from it, and
    nothing in it can single out the masks (issue 41: a sharded LayerNorm was reported as wrong streams)."""
    r = k if rank is None else rank
    if got.get("returned"):
        return [Problem(f"tp_block returned {got['returned']}", rank=r)]
    if got.get("out_shape") is not None:
        return [Problem(f"{WHAT[part]}'s output has shape {tuple(got['out_shape'])}; the block's is "
                        f"{tuple(want['out'].shape)}: every rank returns the whole output", rank=r)]
    if got.get("no_graph"):
        return [Problem(f"the output of {WHAT[part]} has no autograd graph (grad_fn is None)", rank=r)]
    keys = ["out", "in_grad"] + [k for k in want if k.endswith("_grad") and k != "in_grad"]
    for key in keys:
        if close(got.get(key), want[key], tol):
            continue
        v = got.get(key)
        if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(want[key].shape):
            return [Problem(f"{_name(key)} of {WHAT[part]} has "
                            f"{'shape ' + str(tuple(v.shape)) if isinstance(v, torch.Tensor) else 'nothing (None)'}; "
                            f"the unsharded block's is {tuple(want[key].shape)}", rank=r)]
        err = float((v.double() - want[key].double()).abs().max())
        text = f"{_name(key)} of {WHAT[part]} differs from the unsharded block's by up to {err:.3g}"
        if part == "dropout" and not block_right:
            return [Problem(text + ": the block without dropout differs already (above), so this follows from it "
                            "and says nothing of your dropout masks", rank=r, consequence=True)]
        if key == "out" and part == "dropout":
            text += _dropout_cause(k, outs, tol, members)
        return [Problem(text, rank=r)]     # the gradients of a wrong output say nothing more
    if part == "dropout" and not close(got.get("eval_out"), want["eval_out"], tol):
        v = got.get("eval_out")
        err = (f"differs from the unsharded block's by up to {float((v.double() - want['eval_out'].double()).abs().max()):.3g}"
               if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(want["eval_out"].shape) else
               f"is {'shaped ' + str(tuple(v.shape)) if isinstance(v, torch.Tensor) else 'nothing (None)'}")
        return [Problem(f"in evaluation mode (module.eval()), the output of {WHAT[part]} {err}, though in training "
                        f"mode it is right: evaluation drops nothing. The masks must be drawn only while "
                        f"self.training is true (a validation pass, or any model.eval(), would otherwise see a "
                        f"model with its activations still dropped and scaled)", rank=r)]
    return []


def _dropout_cause(r: int, outs: list, tol: float, members: list | None = None) -> str:
    """Why a dropout output is wrong, read from the outputs of every rank of the group (data, not text); `r`:
    this rank's place in it. `members`: the group's global ranks, where they are not 0 .. t - 1."""
    mine = outs[r]
    others = [o for k, o in enumerate(outs) if k != r and isinstance(o, torch.Tensor)]
    if any(not close(mine, o, tol) for o in others):
        return (". The output differs between the ranks: outside the sharded region (the residual stream, "
                "around the replicated LayerNorms) every rank must draw the same mask, from the shared stream, "
                "dropout.stream(block.seed, block.name). Seeded per rank, the replicated activations (and the "
                "LayerNorms' gradients and weights) drift apart between ranks")
    return (". It is the same on every rank, but not the single process's: the masks inside the sharded region "
            "(the attention probabilities of this rank's heads) must each be this shard's own, drawn from "
            "dropout.stream(block.seed, block.name, shard=tp.rank). A mask shared by the ranks drops the same "
            "positions in every shard's heads, which the unsharded model never does" + (
                f". Here the tensor-parallel group is ranks {members}: its shards are tp.rank "
                f"{', '.join(map(str, range(len(members))))}, not the global ranks (dist.get_rank()), which name "
                f"another shard's stream in every group but the first (as in a t x p grid)"
                if members is not None and list(members) != list(range(len(members))) else ""))


def replicated(part: str, t: int, obs: list, groups: list | None = None) -> list[Problem]:
    """The LayerNorms after one AdamW step: identical on every rank of each tensor-parallel group (`groups`, the
    global ranks of each; by default the one group of all ranks)."""
    out = []
    for key in NORMS:
        for name in ("weight", "bias"):
            k = f"{key}_{name}_after"
            spreads = [_spread([obs[m].get(k) if obs[m] else None for m in members])
                       for members in (groups or [list(range(len(obs)))])]
            spreads = [x for x in spreads if x]
            if spreads:
                out.append(Problem(f"{GRADS[key]}'s {name} differs between the ranks after one AdamW step (by up "
                                   f"to {max(spreads):.3g}): a replicated parameter must stay identical everywhere, "
                                   f"which it does only if every rank computes the same gradient for it (the same "
                                   f"input, the same masks outside the sharded region)"))
    return out


def _spread(have: list) -> float:
    """How far the tensors `have` are apart (0 when identical, or when one is missing: the part did not get that
    far, and its problem is said elsewhere)."""
    if any(not isinstance(v, torch.Tensor) for v in have) or all(torch.equal(have[0], v) for v in have[1:]):
        return 0.0
    return max(float((have[0].double() - v.double()).abs().max()) for v in have[1:])


def communication(part: str, r: int, got: dict, want: dict, norm_bytes: int = 0) -> list[Problem]:
    """The rounds of each phase against the block's; `norm_bytes`: the bytes of a LayerNorm's weight (or
    bias), by which an all-reduce of a replicated LayerNorm's gradient is known (data, not the answer's text)."""
    out = []
    for phase, word in (("fwd", "forward"), ("bwd", "backward")):
        have, need = got.get(phase) or [], want[phase]
        if sorted(map(round_key, have)) == sorted(map(round_key, need)):
            continue
        kinds = [k for k, _, _ in have]
        why = ""
        if any(tuple(g) != tuple(need[0][2]) for _, _, g in have):
            why = ": over the wrong ranks; the tensor-parallel group is tp.group"
        elif "all_gather" in kinds:
            why = (". An all-gather is an extra round: q, k, v stay sharded by heads, each rank's attention "
                   "output is exactly the input its row-parallel proj needs")
        elif kinds.count("all_reduce") > 2 and norm_bytes and any(
                k == "all_reduce" and n == norm_bytes for k, n, _ in have) and norm_bytes != need[0][1]:
            extra = sum(1 for k, n, _ in have if k == "all_reduce" and n == norm_bytes)
            why = (f". {extra} of them reduce {norm_bytes:,} bytes, the size of a LayerNorm's weight or bias: the "
                   f"LayerNorms are replicated, and every rank already computes their whole gradient from the whole "
                   f"activation, so a sum over the ranks counts it t times. Only the sharded layers' partial sums "
                   f"are reduced (one round per sub-layer each way)")
        elif kinds.count("all_reduce") > 2:
            extra = kinds.count("all_reduce") - 2
            why = (f". The block needs one round per sub-layer each way (after proj and after the MLP's down in the "
                   f"forward; before qkv and before up in the backward), and this makes {extra} more"
                   + (": three column-parallel layers for q, k and v would each copy into the region, where one "
                      "copy before one qkv layer is enough" if word == "backward" and extra == 2 and
                      all(n == need[0][1] for _, n, _ in have) else ""))
        elif len(have) < 2:
            why = ": each of the two sub-layers (attention, MLP) reduces once each way"
        out.append(Problem(f"{WHAT[part]}'s {word} made {rounds_text(have)}; it needs {rounds_text(need)}{why}",
                           rank=r))
    return out


def holds(part: str, r: int, t: int, got: dict, want: dict) -> list[Problem]:
    out = []
    for key in ("qkv", "proj"):
        have, need = got.get(f"{key}_weight_shape"), want[f"{key}_weight_shape"]
        if have != need:
            out.append(Problem(f"{GRADS[key]}'s weight held has shape {tuple(have) if have else None}; rank {r}'s "
                               f"shard has shape {tuple(need)} (" + (
                                   "the q, k and v rows of its heads" if key == "qkv" else
                                   "the input features of its heads") + ")", rank=r))
    if not out and got.get("params") != want["params"]:
        p = got.get("params")
        whole = p is not None and p >= want["full_params"]
        out.append(Problem(f"this rank holds {p if p is None else format(p, ',')} parameter elements"
                           + (f", the whole block ({want['full_params']:,})" if whole else "")
                           + f"; its share is {want['params']:,} (1/{t} of the four matrices, the whole LayerNorms "
                             f"and the biases added after a reduction)", rank=r))
    return out


def judge_part(part: str, outcome, block_right: bool | None = None) -> dict[str, list[Problem]]:
    """The part's problems on every rank. A case of several tensor-parallel groups side by side (`replicas`,
    kind_block.py) judges each rank as its group's rank k: the k-th shard of the same unsharded block.
    `block_right`, for the dropout part: whether the block without dropout was right (in this case, or in the
    cases the caller judged it in); by default read from this case's own block part, where it ran one."""
    block = None
    if part == "dropout" and any((outcome.obs.get(r, {}).get("tp_block") or {}).get("block") for r in outcome.obs):
        block = judge_part("block", outcome)
        if block_right is None:
            block_right = not block_wrong(block)
    cfg = outcome.case.config
    replicas = settings_of(outcome.case).replicas
    n = outcome.case.stages
    t = n // replicas
    tol = TOLERANCE[cfg.dtype]
    want = expected(part, cfg, t)
    found = {"numbers": [], "replicated": [], "communication": [], "holds": []}
    recs = [(outcome.obs.get(r, {}).get("tp_block") or {}).get(part) for r in range(n)]
    for r, got in enumerate(recs):
        if got is None:
            found["numbers"].append(Problem(f"{WHAT[part]} was not run on this rank (see the errors above)", rank=r))
            continue
        members = grid_members(r % replicas, t, replicas)
        mine = want[r // replicas]
        if replicas > 1:        # its collectives are over its own group
            mine = {**mine, **{phase: [[kind, nbytes, members] for kind, nbytes, _ in mine[phase]]
                               for phase in ("fwd", "bwd")}}
        found["holds"] += holds(part, r, t, got, mine)
        if got.get("raised"):
            line = f" ({got['line']})" if got.get("line") else ""
            found["numbers"].append(Problem(f"{WHAT[part]} raised {got['raised']}: {got['message']}{line}", rank=r))
            continue
        outs = [(recs[m] or {}).get("out") for m in members]
        found["numbers"] += numbers(part, members.index(r), t, got, mine, tol, outs, rank=r, members=members,
                                    block_right=block_right is not False)
        said = communication(part, r, got, mine, norm_bytes=cfg.hidden_size * getattr(torch, cfg.dtype).itemsize)
        if said and block is not None and block["communication"]:     # the same rounds, said for the block
            said = [replace(q, consequence=True, message=q.message.split(";")[0] + "; as the block without dropout "
                            "made (above)") for q in said]
        found["communication"] += said
    found["replicated"] = replicated(part, t, recs, [grid_members(g, t, replicas) for g in range(replicas)])
    if any(g is None or g.get("raised") or g.get("returned") for g in recs):
        found["replicated"].append(Problem(f"the LayerNorms of {WHAT[part]} could not be compared after an "
                                           f"optimizer step: the part did not run on every rank (see above)"))
    return found


def block_wrong(found: dict[str, list[Problem]]) -> bool:
    """Whether the block part's findings (judge_part("block", ...)) say its numbers or what it holds are wrong."""
    return bool(found["numbers"] or found["holds"])


__all__ = ["judge_part", "block_wrong", "expected", "KIND_WORDS"]
