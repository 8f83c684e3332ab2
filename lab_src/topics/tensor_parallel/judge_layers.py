"""The judge of q17's tensor-parallel pieces (the "tp" case kind, topics/tensor_parallel/kind_layers.py).

What each rank should have got is computed here, in the judging process, from the unsharded layers and
the inputs the configuration's seed draws (topics/tensor_parallel/runtime.py): nothing the ranks wrote is
trusted but their results. Per part (copy, reduce, column, row, mlp) and rank:

    numbers         the output, the input's gradient, the shards held and their weight and bias gradients
                    against the unsharded layer's (float64 to 1e-10, float32 to 1e-5, relative to the largest
                    value), each mismatch said with the likely misconception where the numbers show one
                    (the bias added t times, a gradient that is one rank's share or 1/t of the sum)
    communication   the collectives of the forward and of the backward, in kind, bytes and group, against the
                    part's one all-reduce; an extra round (an all-gather between the layers, an all-reduce after
                    each layer) or a missing one is named; and that the result is made of that all-reduce: the
                    output (less the bias) or the input's gradient is what it gave back. A record of the answer's
                    collectives can be stepped around (torch's own entry points are in the rank's reach), the sum
                    cannot: an answer that computes the whole layer from weights it gathered, or kept, outside the
                    record and reduces zeros to look right is told so
    holds           the parameter elements a rank holds: 1/t of the weights, not the whole layer

`judge_part(part, outcome)` returns {"numbers": [...], "communication": [...], "holds": [...]} problems.
"""
from __future__ import annotations

import re
from dataclasses import replace

import torch
import torch.nn.functional as F

from lab_src.judge.problems import Problem
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.records import LAYER_WHAT

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
WHAT = LAYER_WHAT


# ---- what each rank should have got -------------------------------------------------------------------
def expected(part: str, cfg, t: int) -> list[dict]:
    """Per rank: the tensors `part` should produce (keys as the rank records them) and its collectives."""
    data = tpmod.inputs(cfg, t)
    act = tuple(data["x"].shape)
    elem = data["x"].element_size()
    group = list(range(t))
    one = [["all_reduce", _numel(act) * elem, group]]
    if part == "copy":
        total = sum(data["copy_grads"])
        return [{"out": data["x"], "in_grad": total, "fwd": [], "bwd": one,
                 "partial": data["copy_grads"][r]} for r in range(t)]
    if part == "reduce":
        return [{"out": sum(data["parts"]), "in_grad": data["grad"], "fwd": one, "bwd": []} for _ in range(t)]
    up, down = tpmod.full_mlp(cfg)
    if part == "column":
        x = data["x"].clone().requires_grad_()
        y = up(x)
        y.backward(data["col_grad"])
        out = []
        for r in range(t):
            w = tpmod.shard(up.weight.detach(), r, t, 0)
            out.append({"out": tpmod.shard(y.detach(), r, t, -1), "in_grad": x.grad,
                        "weight": w, "bias": tpmod.shard(up.bias.detach(), r, t, 0),
                        "weight_grad": tpmod.shard(up.weight.grad, r, t, 0),
                        "bias_grad": tpmod.shard(up.bias.grad, r, t, 0),
                        "partial": tpmod.shard(data["col_grad"], r, t, -1) @ w,
                        "weight_shape": list(w.shape), "params": (up.weight.numel() + up.bias.numel()) // t,
                        "fwd": [], "bwd": [["all_reduce", x.numel() * elem, group]]})
        return out
    if part == "row":
        a = tpmod.hidden_activation(cfg, data["x"]).clone().requires_grad_()
        y = down(a)
        y.backward(data["grad"])
        out = []
        for r in range(t):
            w = tpmod.shard(down.weight.detach(), r, t, 1)
            out.append({"out": y.detach(), "in_grad": tpmod.shard(a.grad, r, t, -1), "weight": w,
                        "bias": down.bias.detach(), "weight_grad": tpmod.shard(down.weight.grad, r, t, 1),
                        "bias_grad": down.bias.grad, "weight_shape": list(w.shape), "full_bias": down.bias.detach(),
                        "params": down.weight.numel() // t + down.bias.numel(),
                        "fwd": one, "bwd": []})
        return out
    x = data["x"].clone().requires_grad_()
    y = down(F.gelu(up(x)))
    y.backward(data["grad"])
    full = sum(p.numel() for p in (*up.parameters(), *down.parameters()))
    share = (up.weight.numel() + up.bias.numel() + down.weight.numel()) // t + down.bias.numel()
    return [{"out": y.detach(), "in_grad": x.grad,
             "up_weight_grad": tpmod.shard(up.weight.grad, r, t, 0), "up_bias_grad": tpmod.shard(up.bias.grad, r, t, 0),
             "down_weight_grad": tpmod.shard(down.weight.grad, r, t, 1), "down_bias_grad": down.bias.grad,
             "up_weight_shape": list(tpmod.shard(up.weight, r, t, 0).shape),
             "down_weight_shape": list(tpmod.shard(down.weight, r, t, 1).shape),
             "params": share, "full_params": full, "full_bias": down.bias.detach(), "fwd": one, "bwd": one}
            for r in range(t)]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


# ---- comparing ------------------------------------------------------------------------------------------
def close(got, want, tol: float) -> bool:
    if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
        return False
    got, want = got.double(), want.detach().double()
    return bool(torch.isfinite(got).all()) and \
        float((got - want).abs().max()) <= tol * max(1.0, float(want.abs().max()))


def _shape(v) -> str:
    return f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else "nothing (None)"


NAMES = {"out": "the output", "in_grad": "the input's gradient", "weight_grad": "the weight shard's gradient",
         "bias_grad": "the bias's gradient", "weight": "the weight shard", "bias": "the bias held",
         "up_weight_grad": "the column-parallel up's weight gradient",
         "up_bias_grad": "the column-parallel up's bias gradient",
         "down_weight_grad": "the row-parallel down's weight gradient",
         "down_bias_grad": "the row-parallel down's bias gradient"}


def numbers(part: str, r: int, t: int, got: dict, want: dict, tol: float) -> list[Problem]:
    """The tensors of one rank's part against the unsharded layer's, each mismatch with its likely cause."""
    out = []
    if got.get("out_shape") is not None and part in ("column", "mlp"):
        whole = [*want["out"].shape[:-1], want["out"].shape[-1] * t]
        if part == "column" and got["out_shape"] == whole:
            return [Problem(f"{WHAT[part]} returned the whole output, shape {tuple(whole)}, not this rank's slice "
                            f"{tuple(want['out'].shape)}: it gathered the shards (an all-gather round). Keep the "
                            f"column-parallel output sharded: each rank's slice is exactly the input the "
                            f"row-parallel layer needs", rank=r)]
    if got.get("returned"):
        return [Problem(f"{WHAT[part]} returned {got['returned']}", rank=r)]
    if got.get("no_graph"):
        return [Problem(f"the output of {WHAT[part]} has no autograd graph (grad_fn is None): nothing flows back "
                        f"to the input or the weights. Was it computed under torch.no_grad(), or detached?", rank=r)]
    for key in [k for k in NAMES if k in want]:
        v = got.get(key)
        if close(v, want[key], tol):
            continue
        out.append(Problem(_mismatch(part, key, r, t, v, want, tol), rank=r))
        if key == "out":
            break      # the gradients of a wrong output say nothing more
    return out


def _mismatch(part: str, key: str, r: int, t: int, v, want: dict, tol: float) -> str:
    what = f"{NAMES[key]} of {WHAT[part]}"
    w = want[key]
    if not isinstance(v, torch.Tensor) or tuple(v.shape) != tuple(w.shape):
        return f"{what} has {_shape(v)}; the unsharded layer's is {_shape(w)}"
    err = float((v.double() - w.double()).abs().max())
    base = f"{what} differs from the unsharded layer's by up to {err:.3g}"
    if key == "out" and "full_bias" in want and t > 1 and close(v, w + (t - 1) * want["full_bias"], tol):
        return (f"{base}: it is the right output plus {t - 1} more copies of the bias. Every rank added the "
                f"bias before the all-reduce, so the sum counts it {t} times: add it once, after the reduction")
    if key == "in_grad":
        if close(v, w / t, tol):
            return (f"{base}: it is 1/{t} of the right gradient, the average over the group instead of the sum "
                    f"(each rank's share of the output contributes its own part of the input's gradient: sum them)")
        if "partial" in want and close(v, want["partial"], tol):
            return (f"{base}: it is only this rank's own share of it. The backward of the copy into the "
                    f"tensor-parallel region must sum the shares over the group (an all-reduce), the mirror "
                    f"of the forward's all-reduce")
        if part == "mlp" and close(v * t, w, tol * t):
            return f"{base}: it is 1/{t} of the right gradient (averaged over the group instead of summed)"
    if key == "out" and part == "reduce" and close(v, w / t, tol):
        return f"{base}: it is the average over the group; the reduction is a sum"
    return base


# ---- communication -------------------------------------------------------------------------------------
KIND_WORDS = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter",
              "broadcast": "broadcast", "reduce": "reduce", "dist_barrier": "barrier"}


def rounds_text(rounds: list) -> str:
    if not rounds:
        return "no collective"
    return ", ".join(f"a barrier over ranks {g}" if k == "dist_barrier" else
                     f"{KIND_WORDS.get(k, k)} of {b:,} bytes over ranks {g}" for k, b, g in rounds)


def communication(part: str, r: int, got: dict, want: dict) -> list[Problem]:
    """The collectives of one rank's part, phase by phase, against the one all-reduce it needs."""
    out = []
    for phase, word in (("fwd", "forward"), ("bwd", "backward")):
        have, need = got.get(phase) or [], want[phase]
        if sorted(map(round_key, have)) == sorted(map(round_key, need)):
            continue
        text = f"{WHAT[part]}'s {word} made {rounds_text(have)}; it needs {rounds_text(need)}{_why(part, phase, have, need)}"
        # the same mistake on 2 ranks and on 4 reads the same but for the group: said once, "also on ... (t = 4)"
        out.append(Problem(text, rank=r, gist=re.sub(r"\d[\d,]* bytes over ranks \[[^\]]*\]", "# over the group", text)))
    return out


# what a part's one all-reduce must give back, per phase: the output it makes (a row-parallel output: with or
# without its bias, added after the sum or once inside it), or the input's gradient it makes
MADE_OF = {("reduce", "fwd"): "out", ("row", "fwd"): "out", ("mlp", "fwd"): "out",
           ("copy", "bwd"): "in_grad", ("column", "bwd"): "in_grad", ("mlp", "bwd"): "in_grad"}


def made_of_the_sum(part: str, r: int, got: dict, want: dict, tol: float) -> list[Problem]:
    """Where a phase made its one all-reduce as it should: is the part's result what that all-reduce gave back?"""
    out = []
    for phase, word in (("fwd", "forward"), ("bwd", "backward")):
        key = MADE_OF.get((part, phase))
        carried, result = got.get(f"{phase}_carried") or [], got.get(key)
        if key is None or len(carried) != 1 or not isinstance(result, torch.Tensor) or \
                sorted(map(round_key, got.get(phase) or [])) != sorted(map(round_key, want[phase])):
            continue
        back = carried[0]["got"]
        if not isinstance(back, torch.Tensor) or back.numel() != result.numel():
            continue        # another shape: the communication check has named the bytes already
        back = back.reshape(result.shape)
        if close(back, result, tol) or ("full_bias" in want and close(back + want["full_bias"], result, tol)) \
                or not close(result, want[key], tol):
            continue        # made of its sum; or a wrong result, which the numbers name already
        zeros = not bool(back.abs().max() > 0) if back.numel() else False
        what = "output" if key == "out" else "input's gradient"
        gave = "zeros (every rank handed it zeros)" if zeros else "a tensor the result is not made of"
        why = ("the t row-parallel partial outputs" if key == "out" else
               "the t partial input gradients (one per rank's slice of the weights)")
        out.append(Problem(
            f"{WHAT[part]}'s {word} made its one all-reduce, but its {what} is not what that all-reduce gave back: "
            f"it gave back {gave}. The all-reduce is where {why} are added up; this {what} matches the unsharded "
            f"layer's without it, so it was computed from more than this rank's shards: the whole weights, "
            f"gathered or kept outside the lab's record of collectives. That is the memory, the compute and the "
            f"traffic tensor parallelism exists to divide by t", rank=r))
    return out


def round_key(row) -> tuple:
    kind, nbytes, group = row
    return kind, int(nbytes), tuple(group)


def _why(part: str, phase: str, have: list, need: list) -> str:
    kinds = [k for k, _, _ in have]
    if "dist_barrier" in kinds:
        return (". A barrier is a round too, though it carries no data: every rank of the group waits for the "
                "slowest one, for nothing. The layers need no synchronisation of their own: the all-reduce "
                "already waits for every rank's partial sum")
    if "all_gather" in kinds:
        return (". The all-gather is an extra round: the column-parallel layer's output stays sharded, and each "
                "rank's slice of it is exactly the input the row-parallel layer needs (t times the bytes of the "
                "activation, for nothing)")
    if part == "column" and phase == "fwd" and "all_reduce" in kinds:
        return (". An all-reduce after the column-parallel layer is a round too many: its outputs on the ranks "
                "are disjoint slices of the output features, not partial sums, so there is nothing to reduce")
    if part == "mlp" and phase == "fwd" and kinds.count("all_reduce") > 1:
        return (". One all-reduce after each layer is a round too many: the column-parallel layer's outputs are "
                "disjoint slices, not partial sums, so there is nothing to reduce after it; only the "
                "row-parallel layer's partial sums are reduced")
    if part == "mlp" and phase == "bwd" and kinds.count("all_reduce") > 1:
        return (". Only the input's gradient needs summing (the copy's backward, before the column-parallel "
                "layer); the row-parallel layer's backward is the identity")
    if not have and need:
        return (": without it " + ("each rank's result is only its own partial sum" if phase == "fwd" else
                                  "each rank's input gradient is only its own shard's contribution; every "
                                  "all-reduce in a forward has its mirror in the backward"))
    if have and not need:
        return (f": this {'forward' if phase == 'fwd' else 'backward'} needs no communication "
                + ("(the copy into the region is the identity; its backward sums)" if phase == "fwd" else
                   "(the reduction's backward passes the gradient through: every rank already has it whole)"))
    groups = {tuple(g) for _, _, g in have} - {tuple(g) for _, _, g in need}
    if groups:
        return ": over the wrong ranks; the tensor-parallel group is tp.group"
    return ""


# ---- what each rank holds ------------------------------------------------------------------------------
def holds(part: str, r: int, t: int, got: dict, want: dict) -> list[Problem]:
    out = []
    shapes = [("weight_shape", "weight")] if part in ("column", "row") else \
        [("up_weight_shape", "up.weight"), ("down_weight_shape", "down.weight")]
    for key, name in shapes:
        have, need = got.get(key), want[key]
        if have == need:
            continue
        column = part == "column" or name == "up.weight"
        crossed = [need[0] * t, need[1] // t] if column else [need[0] // t, need[1] * t]
        if have == crossed:
            along = "output features (dim 0: rows of nn.Linear's out_features x in_features weight)" if column else \
                "input features (dim 1: the columns of the weight)"
            out.append(Problem(f"{name} held has shape {tuple(have)}: cut along the wrong dimension. A "
                               f"{'column' if column else 'row'}-parallel layer splits the {along}; its shard has "
                               f"shape {tuple(need)}", rank=r))
        else:
            out.append(Problem(f"{name} held has shape {tuple(have) if have else None}; rank {r}'s shard has "
                               f"shape {tuple(need)}", rank=r))
    params = got.get("params")
    if not out and params != want["params"]:
        if part == "mlp" and params is not None and params >= want["full_params"]:
            out.append(Problem(f"this rank holds {params:,} parameter elements, the whole MLP ({want['full_params']:,}): "
                               f"tensor parallelism keeps 1/{t} of the weights on each rank ({want['params']:,} "
                               f"here). Keep only the shards as parameters, not the unsharded layers", rank=r))
        else:
            out.append(Problem(f"this rank holds {params if params is None else format(params, ',')} parameter "
                               f"elements; its share is {want['params']:,} (1/{t} of the weights"
                               + (", and the whole bias" if part != "column" else "") + ")", rank=r))
    return out


# what each part is built on (the layers call the communication functions, the MLP the layers): a problem of
# a part it is built on is its cause
BUILT_ON = {"column": ("copy",), "row": ("reduce",), "mlp": ("copy", "reduce", "column", "row")}   # roots first


def causes_first(found: dict[str, dict[str, list[Problem]]]) -> dict[str, dict[str, list[Problem]]]:
    """The parts' problems (`found[part]`: judge_part's) with what follows from another problem marked so: a
    part built on a wrong part (a layer on its communication function, the MLP on its layers) fails because of
    it, and a wrong value of a part whose rounds are wrong follows from those rounds. One mistake, one cause,
    its consequences under it (issue 41: one missing backward all-reduce read "FAILED, 9 problems")."""
    def wrong(part):
        f = found.get(part) or {}
        return bool(f.get("numbers") or f.get("communication") or f.get("holds"))

    def follows(p: Problem, cause: str) -> Problem:     # what it is (its first clause), and where it comes from
        what = re.split(r"(?<=\S)(?:: |\. )", p.message, maxsplit=1)[0]
        return replace(p, consequence=True, message=f"{what}: it follows from {cause} above")
    out = {}
    for part, f in found.items():
        under = next((dep for dep in BUILT_ON.get(part, ()) if wrong(dep)), None)
        if under is not None:
            out[part] = {k: [follows(p, f"{WHAT[under]}'s problem ({WHAT[part]} is built on it)") for p in v]
                         for k, v in f.items()}
        elif f.get("communication") and f.get("numbers"):
            out[part] = {**f, "numbers": [follows(p, f"{WHAT[part]}'s rounds") for p in f["numbers"]]}
        else:
            out[part] = f
    return out


def judge_part(part: str, outcome) -> dict[str, list[Problem]]:
    """The problems of one part of a "tp" case, by aspect; a part that raised is one problem."""
    cfg, t = outcome.case.config, outcome.case.stages
    tol = TOLERANCE[cfg.dtype]
    want = expected(part, cfg, t)
    found = {"numbers": [], "communication": [], "holds": []}
    for r in range(t):
        got = (outcome.obs.get(r, {}).get("tp") or {}).get(part)
        if got is None:
            found["numbers"].append(Problem(f"{WHAT[part]} was not run on this rank (see the errors above)", rank=r))
            continue
        if part in ("column", "row", "mlp"):
            found["holds"] += holds(part, r, t, got, want[r])     # recorded before the forward: a raise keeps it
        if got.get("raised"):
            line = f" ({got['line']})" if got.get("line") else ""
            found["numbers"].append(Problem(f"{WHAT[part]} raised {got['raised']}: {got['message']}{line}", rank=r))
            continue
        found["numbers"] += numbers(part, r, t, got, want[r], tol)
        found["communication"] += communication(part, r, got, want[r]) + made_of_the_sum(part, r, got, want[r], tol)
    return found
