"""Compare a pipelined run with the unsharded baseline: outputs and loss on the last stage, and on
every rank the gradient of every parameter it owns. When they differ, say how, in terms of the usual
mistakes: a gradient scaled by the number of micro-batches, gradients that never reached a stage,
outputs in the wrong order.

Tolerances are those of `torch.testing.assert_close` for the run's dtype.
"""
from __future__ import annotations

import torch

from lab_src.judge.problems import Problem

TOLERANCES = {torch.float32: (1.3e-6, 1e-5), torch.float64: (1e-7, 1e-7)}


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape:
        return False
    rtol, atol = TOLERANCES.get(b.dtype, (1.3e-6, 1e-5))
    return bool(torch.allclose(a.to(b.dtype), b, rtol=rtol, atol=atol))


def scale_between(got: torch.Tensor, want: torch.Tensor) -> float | None:
    """The factor c with got == c * want, if there is one (to a loose tolerance), else None."""
    want = want.double().reshape(-1)
    got = got.double().reshape(-1)
    norm = float(want @ want)
    if norm == 0.0:
        return None
    c = float(got @ want) / norm
    residual = float((got - c * want).norm()) / (norm ** 0.5)
    return c if residual < 1e-3 else None


def explain_scale(c: float, m: int) -> str:
    if m > 1 and abs(c - m) < 1e-3 * m:
        return (f"they are {m}x the baseline's, and {m} is the number of micro-batches: divide each "
                f"micro-batch's loss by the number of micro-batches before backward")
    if m > 1 and abs(c - 1 / m) < 1e-3 / m:
        return f"they are 1/{m} of the baseline's: the loss was divided by the number of micro-batches twice"
    if abs(c) < 1e-9:
        return "they are all zero"
    if abs(c - 2) < 2e-3:
        return "they are twice the baseline's: gradients were accumulated twice (backward ran twice?)"
    return f"they are {c:.4g}x the baseline's"


def scale_gist(c: float | None, m: int) -> str:
    """The same words for the same kind of scale, whatever m is (to say it once: judge/summary.py)."""
    if c is None:
        return ""
    if m > 1 and abs(c - m) < 1e-3 * m:
        return "scaled by the number of micro-batches"
    if m > 1 and abs(c - 1 / m) < 1e-3 / m:
        return "divided by the number of micro-batches twice"
    return ""


def compare_outputs(obs_last: dict, baseline: dict, m: int, rank: int) -> list[Problem]:
    outputs = obs_last.get("outputs")
    if outputs is None:
        why = obs_last.get("returned") or "afab_step returned no outputs on the last stage"
        return [Problem(why, rank=rank)]
    if len(outputs) != m:
        return [Problem(f"the last stage returned {len(outputs)} outputs for {m} micro-batches", rank=rank)]
    chunks = baseline["output"].chunk(m)
    problems = []
    for k, out in enumerate(outputs):
        want = chunks[k]
        if out.shape != want.shape:
            problems.append(Problem(f"the output has shape {tuple(out.shape)}; the baseline's micro-batch "
                                      f"has {tuple(want.shape)}", rank=rank, microbatch=k))
        elif not close(out, want):
            other = next((j for j, c in enumerate(chunks) if j != k and close(out, c)), None)
            if other is not None:
                msg = (f"the output equals the baseline's micro-batch {other}: micro-batches are out of order "
                       f"(keep inputs and outputs in the order the micro-batches were read)")
            else:
                diff = float((out.double() - want.double()).abs().max())
                msg = f"the output differs from the baseline (largest difference {diff:.3g})"
            problems.append(Problem(msg, rank=rank, microbatch=k))
    return problems


def compare_loss(obs_last: dict, baseline: dict, m: int, rank: int) -> list[Problem]:
    loss, want = obs_last.get("loss"), baseline["loss"]
    if loss is None:
        return [Problem("the last stage returned no loss", rank=rank)]
    if abs(loss - want) <= 1e-5 + 1e-5 * abs(want):
        return []
    c = loss / want if want else float("inf")
    return [Problem(f"the loss is {loss:.6g}, the baseline's {want:.6g}: " + explain_scale(c, m),
                    rank=rank, gist=scale_gist(c, m))]


def compare_grads(obs: dict, baseline: dict, m: int, rank: int) -> list[Problem]:
    grads = obs.get("grads") or {}
    base = baseline["grads"]
    missing = [n for n, g in grads.items() if g is None]
    if grads and len(missing) == len(grads):
        return [Problem("no parameter of this stage has a gradient: no gradient reached this stage "
                          "(was backward run, and did the next stage send its input gradient back?)", rank=rank)]
    problems = [Problem(f"{n} has no gradient", rank=rank) for n in missing[:3]]
    wrong = [n for n, g in grads.items() if g is not None and not close(g, base[n])]
    if wrong:
        got = torch.cat([grads[n].reshape(-1).double() for n in wrong])
        want = torch.cat([base[n].reshape(-1).double() for n in wrong])
        c = scale_between(got, want)
        how = explain_scale(c, m) if c is not None else \
            f"largest difference {float((got - want).abs().max()):.3g}"
        few = ", ".join(wrong[:3]) + (f" and {len(wrong) - 3} more" if len(wrong) > 3 else "")
        problems.append(Problem(f"{len(wrong)} of {len(grads)} gradients differ from the baseline "
                                  f"({few}): {how}", rank=rank, gist=scale_gist(c, m)))
    return problems


def compare_run(outcome, baseline: dict) -> list[Problem]:
    """Everything numeric about one pipeline case, on every rank."""
    m, p = outcome.case.microbatches, outcome.case.stages
    problems = []
    last = outcome.obs.get(p - 1, {})
    problems += compare_outputs(last, baseline, m, p - 1)
    problems += compare_loss(last, baseline, m, p - 1)
    for r in range(p):
        problems += compare_grads(outcome.obs.get(r, {}), baseline, m, r)
        if r != p - 1 and outcome.obs.get(r, {}).get("outputs"):
            problems.append(Problem("a stage other than the last returned outputs; return ([], None) there", rank=r))
        if r != p - 1 and outcome.obs.get(r, {}).get("loss") is not None:
            problems.append(Problem(f"a stage other than the last returned the loss "
                                    f"{outcome.obs[r]['loss']!r}; only the last stage has one: return "
                                    f"([], None) there", rank=r))
    return problems


def check_depends(outcome, unchanged: dict) -> list[Problem]:
    """On a case where rank 0 changed its embedding after building it (pipeline/perturb.py), the last
    stage's outputs must be the changed model's: outputs equal to the unchanged model's (`unchanged`, the
    plain baseline) were computed without what the earlier stages sent."""
    m, p = outcome.case.microbatches, outcome.case.stages
    outputs = outcome.obs.get(p - 1, {}).get("outputs")
    if p < 2 or not outputs or len(outputs) != m:
        return []
    chunks = unchanged["output"].chunk(m)
    if not all(out.shape == want.shape and close(out, want) for out, want in zip(outputs, chunks)):
        return []
    return [Problem("the last stage's outputs do not depend on what stage 0 sent: after the stages were built, "
                    "the grader changed stage 0's position embedding, and the outputs are still those of the "
                    "unchanged model. A stage computes from the activation it receives (recv_forward), never "
                    "from layers of other stages it builds or runs itself", rank=p - 1)]
