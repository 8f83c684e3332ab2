"""What went wrong in a One-Forward-One-Backward step, said in its own terms (q12).

The schedule's rules (pipeline/schedules.py) say *that* a run broke 1F1B; this says which part of the
step is wrong, from the forwards and backwards each rank recorded, even in a run that hung or failed:

- the warm-up: rank r must run min(p - r - 1, m) forwards before the steady state, so its first
  backward comes after min(p - r, m) forwards; one more or one fewer is the usual off-by-one;
- the cool-down: after the steady state, the backwards of the last warm-up micro-batches remain; a step
  that stops after the steady state leaves them without a backward (and their gradients unsent, so the
  previous stage waits for them);
- anything else: the rank's order beside 1F1B's.
"""
from __future__ import annotations

from lab_src.judge.problems import Problem
from lab_src.pipeline.schedules import OneForwardOneBackward, compute_order, letters

ONE_F_ONE_B = OneForwardOneBackward()


def diagnose(events, p: int, m: int) -> list[Problem]:
    """One problem per rank whose forwards and backwards are not 1F1B's, naming the part that differs."""
    problems = []
    for r in range(p):
        got = [(e.kind, e.microbatch) for e in compute_order(events, r)]
        if not got:
            continue
        want = [(s.op.value, s.microbatch) for s in ONE_F_ONE_B.program(r, p, m) if s.op.is_compute]
        if got == want:
            continue
        warm = ONE_F_ONE_B.warmup(r, p, m)
        first_b = next((i for i, (kind, _) in enumerate(got) if kind == "backward"), None)
        forwards = {mb for kind, mb in got if kind == "forward"}
        backwards = {mb for kind, mb in got if kind == "backward"}
        expected_first = min(p - r, m)          # warm-up forwards plus the steady state's first one
        if first_b is not None and first_b != expected_first and len(forwards) == m:
            off = first_b - expected_first
            msg = (f"this rank runs {_n(first_b, 'forward')} before its first backward; 1F1B runs {expected_first}: "
                   f"min(p - r - 1, m) = {_n(warm, 'warm-up forward')} on rank {r} of {_n(p, 'stage')}, then the "
                   f"steady state's first forward. The warm-up is off by {off:+d}")
            problems.append(Problem(msg, rank=r, microbatch=got[first_b][1]))
        elif forwards - backwards and len(forwards) == m:
            never = sorted(forwards - backwards)
            msg = (f"micro-batch(es) {_few(never)} went forward on this rank but never backward: after the steady "
                   f"state, the cool-down runs the backwards of the last {warm} micro-batch(es) (min(p - r - 1, m) "
                   f"on rank {r}); without it their gradients are missing and the previous stage waits for them")
            problems.append(Problem(msg, rank=r, microbatch=never[0]))
        else:
            at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
            mb = (got[at] if at < len(got) else want[at])[1]
            problems.append(Problem(f"this rank runs {_order(got)}; 1F1B runs {_order(want)}", rank=r, microbatch=mb))
    return problems


def _n(k: int, noun: str) -> str:
    """'1 stage', '3 stages'."""
    return f"{k} {noun}{'' if k == 1 else 's'}"


def _order(compute, limit: int = 12) -> str:
    return letters(compute, limit)


def _few(mbs: list[int], n: int = 4) -> str:
    return ", ".join(map(str, mbs[:n])) + (f" and {len(mbs) - n} more" if len(mbs) > n else "")


# ---- the prediction (graded: grader/hidden/q12_one_f_one_b_step.py) -----------------------------------
PREDICTION_NAME = "predicted_warmup"       # a function of the answer cell: numbers only (judge/numeric.py)
PREDICTION_STAGES, PREDICTION_MICROBATCHES = 4, (8, 2)     # the check's p and m, and the corner m < p


def expected_prediction(p: int = PREDICTION_STAGES, ms=PREDICTION_MICROBATCHES) -> dict[str, int]:
    """{"m8_rank0": 3, ...}: the warm-up forwards of each rank of 1F1B, for each m."""
    return {f"m{m}_rank{r}": ONE_F_ONE_B.warmup(r, p, m) for m in ms for r in range(p)}


def prediction_problems(got: dict) -> list[Problem]:
    """One problem per m whose warm-ups differ from 1F1B's (what the student said, and the reasoning that
    gives the count; never the counts themselves: they are graded)."""
    p, want = PREDICTION_STAGES, expected_prediction()
    problems = []
    for m in PREDICTION_MICROBATCHES:
        keys = [f"m{m}_rank{r}" for r in range(p)]
        if all(k in got and got[k] == want[k] for k in keys):
            continue
        missing = [k for k in keys if k not in got]
        if missing:
            problems.append(Problem(f"{PREDICTION_NAME}() gives no {', '.join(map(repr, missing))} entry: it "
                                    f"needs one per rank for each m, {keys[0]!r} to {keys[-1]!r}"))
            continue
        said = ", ".join(f"{got[k]:g}" for k in keys)
        why = (f"with only {m} micro-batches there are only {m} forwards to run: a warm-up cannot run forwards "
               f"for micro-batches that do not exist"
               if any(got[k] > m for k in keys) else
               "a rank runs forwards until the gradient of its first micro-batch can come back, and the last "
               "stage needs none: it starts micro-batch 0's backward right after its forward")
        problems.append(Problem(f"{PREDICTION_NAME}() says the warm-ups for p = {p}, m = {m} are {said} (ranks 0 to "
                                f"{p - 1}); 1F1B's differ: {why}"))
    return problems
