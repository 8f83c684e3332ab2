"""q16's split backward judged from what a "split" case observed (topics/zero_bubble/kind.py): per stage, the
two halves against one backward. Three questions, each a list of problems (empty: passed):

    numbers   I's input gradient and I + W's weight gradients equal one backward's (1e-12 in float64),
              added to what `.grad` held, as backward() adds
    once      I + W together do the floating-point work of one backward, not a second pass over the
              input's path (within 5 %)
    freed     once W has run, autograd holds nothing more for the micro-batch: read from the bytes of saved
              tensors still alive (harness/memory.py), whatever keeps them
"""
from __future__ import annotations

from lab_src.judge.problems import Problem

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
ONCE = 1.05
MB = 0              # the one micro-batch a "split" case runs through each stage (kind.py)


def _where(r: int, p: int) -> str:
    what = "the first stage, whose input is tokens" if r == 0 else \
        "the last stage, whose output is its loss" if r == p - 1 else "a middle stage"
    return f"stage {r} of {p} ({what})"


def numbers(obs: dict, dtype: str) -> list[Problem]:
    tol, problems = TOLERANCE.get(dtype, 1e-5), []
    p = len(_stages(obs))
    for r, o in sorted(_stages(obs).items()):
        where = _where(r, p)
        if o.get("outcome") != "returned":
            problems.append(_raised(o, r, p))
            continue
        if r == 0 and o["input_grad_returned"]:
            problems.append(Problem(f"{where}: backward_input returned an input gradient, but token ids have none: "
                                    f"return None as the gradient on the first stage"))
        diff = o.get("input_grad_diff")
        if diff is not None and not diff <= tol:
            problems.append(Problem(f"{where}: the input gradient backward_input returned differs from one backward()'s "
                                    f"by {diff:.3g} (at most {tol:g} allowed)"))
        if o["missing_weights"]:
            problems.append(Problem(f"{where}: after backward_weight, {o['missing_weights'][0]} has no gradient at all"
                                    + (f" (nor {len(o['missing_weights']) - 1} other weights)"
                                       if len(o["missing_weights"]) > 1 else "")))
        elif o["overwritten"]:
            problems.append(Problem(f"{where}: backward_weight replaced what .grad held with this micro-batch's "
                                    f"gradient: backward() adds to .grad, and the step needs the sum over its "
                                    f"micro-batches (.grad += g, or .grad = g only where .grad is None)"))
        elif not o["weight_grad_diff"] <= tol:
            problems.append(Problem(f"{where}: the gradient of {o['worst_weight']} after backward_input and "
                                    f"backward_weight differs from one backward()'s by {o['weight_grad_diff']:.3g} "
                                    f"(at most {tol:g} allowed)"))
    return problems


def once(obs: dict) -> list[Problem]:
    problems = []
    p = len(_stages(obs))
    for r, o in sorted(_stages(obs).items()):
        if o.get("outcome") != "returned":
            problems.append(_raised(o, r, p))
            continue
        if not o["flops_backward"]:
            continue
        ratio = o["flops_split"] / o["flops_backward"]
        if ratio > ONCE:
            problems.append(Problem(f"{_where(r, p)}: backward_input and backward_weight together do {ratio:.2f} times "
                                    f"the floating-point work of one backward: W goes over the input's path a "
                                    f"second time. Keep, in I, the gradients that reach the nodes where the path "
                                    f"branches off towards the weights, and start W there "
                                    f"(torch.autograd.graph.GradientEdge)"))
    return problems


def freed(obs: dict) -> list[Problem]:
    problems = []
    p = len(_stages(obs))
    for r, o in sorted(_stages(obs).items()):
        if o.get("outcome") != "returned":
            problems.append(_raised(o, r, p))
            continue
        left = o["held_after_weight"]
        if left:
            problems.append(Problem(
                f"{_where(r, p)}: after its W, micro-batch {MB}'s graph is still alive: {left} bytes of the tensors "
                f"its forward saved for backward are still held ({o['held_before']} after F{MB}, "
                f"{o['held_after_input']} after I{MB}), measured once backward_weight (W{MB}) had returned and the "
                f"stage had dropped what your backward_input kept. Something of yours still reaches that graph: "
                f"`kept`, or a tensor or node of the graph, held in a dict, list or cache that outlives W, in a "
                f"closure or a hook, or in a reference cycle of a helper (only Python's garbage collector frees a "
                f"cycle, later). retain_graph=True on the last pass over those nodes is one way their saved tensors "
                f"outlive it; a reference is what keeps them. Keep what W needs only in `kept`, and nothing once W "
                f"has run"))
    return problems


def summary(obs: dict) -> list[str]:
    """One line per stage for the check's report."""
    lines = []
    p = len(_stages(obs))
    for r, o in sorted(_stages(obs).items()):
        if o.get("outcome") != "returned":
            continue
        ratio = o["flops_split"] / o["flops_backward"] if o["flops_backward"] else float("nan")
        lines.append(f"    stage {r} of {p}: I + W = {ratio:.2f} x one backward's operations; bytes held "
                     f"{o['held_before']} after F, {o['held_after_input']} after I, {o['held_after_weight']} after W")
    return lines


def _stages(obs: dict) -> dict:
    found = obs.get("split_stages")
    return found if isinstance(found, dict) else {}


def _raised(o: dict, r: int, p: int) -> Problem:
    return Problem(f"{_where(r, p)}: {o.get('type')}: {o.get('message')}")
