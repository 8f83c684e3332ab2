"""Parent side of q23 (recompute_block): judge what the rank of a "recompute" case recorded (kind.py), per mode,
from behaviour, never from the answer's form (torch.utils.checkpoint, its selective policy, a hand-written autograd
Function: each is judged by what it did):

    gradients   the outputs, the inputs' gradients and the parameters' gradients of forward A, forward B, backward
                B, backward A, forward and backward C are the plain block's, computed here (within a rounding: the
                judge's process may use other threads than the rank's; in bfloat16 the parameters' gradients are
                held to the rank's own run of the plain block, checked against this one); a wrong one is named from the data: a
                recomputation that drew new dropout masks (A's and B's outputs right, their gradients wrong), one
                that left the block's streams where the recomputation ended (A's and B's gradients right, C's
                output wrong: it redrew an earlier micro-batch's masks), gradients that never reached the block's
                parameters
    memory      the bytes the forward left alive (the lab's count: measure.py `kept`) are at most the mode's closed
                form (records.py `kept_bytes`), within the slack of a recomputation's generator states; keeping less
                costs recomputation, which the FLOPs part bounds (a selective policy that also recomputes GELU and
                the residual masks keeps less for no more matmul work: valid)
    flops       the matmul FLOPs the backward adds to the plain block's 3F: none for "none", at most the attention
                core's 4 bs^2 h and more than none for "selective", one forward F for "full"
"""
from __future__ import annotations

import functools

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.topics.long_sequences.records import (
    ITEMSIZE,
    MODES,
    SLACK,
    SLACK_BYTES,
    core_flops,
    extra_flops_range,
    forward_flops,
    kept_bytes,
    shape_of,
)

PARTS = ("gradients", "memory", "flops")
# the largest difference a right answer shows against the judge's own run, relative to the largest element
TOLERANCE = {"float32": 1e-4, "float64": 1e-9, "bfloat16": 3e-2}
WHO = "recompute_block"


@functools.lru_cache(maxsize=8)
def _plain(cfg_items: tuple, batch: int, dtype: str) -> dict:
    from lab_src.pipeline.config import LabConfig
    from lab_src.topics.long_sequences.measure import inputs, make_block, sequence
    from lab_src.topics.long_sequences.records import RecomputeSettings
    cfg, settings = LabConfig(**dict(cfg_items)), RecomputeSettings(batch=batch, dtype=dtype)
    block = make_block(cfg, settings.dtype)
    return sequence(block, block, inputs(cfg, settings))


def plain_run(outcome) -> dict:
    """The plain block's run of the case, computed in the judging process."""
    cfg, settings = outcome.case.config, settings_of(outcome.case)
    return _plain(tuple(sorted(cfg.to_dict().items())), settings.batch, settings.dtype)


def close(got, want, dtype: str) -> bool:
    if not isinstance(got, torch.Tensor) or want is None or got.shape != want.shape:
        return False
    diff = (got.double() - want.double()).abs().max().item()
    return diff <= TOLERANCE[dtype] * max(1.0, want.double().abs().max().item())


def plain_problems(rank_plain: dict | None, want: dict, dtype: str) -> list[Problem]:
    """The lab's own block run on the rank against the judge's run: they differ only if something in the rank's
    process changed the block or torch."""
    if not rank_plain:
        return [Problem(f"the rank did not run the lab's own block ({WHO} ran before it?)")]
    same = all(close(g, w, dtype) for k in ("outputs", "input_grads") for g, w in zip(rank_plain[k], want[k]))
    return [] if same else [Problem("the lab's own block computed other numbers on the rank than here: something in "
                                    "the answer's process changed the block or torch")]


def gradient_problems(mode: str, got: dict, want: dict, dtype: str, rank_plain: dict | None = None) -> list[Problem]:
    """`want`: the judge's run of the plain block; in bfloat16 the parameters' gradients are held to the rank's own
    run of it (`rank_plain`: a bfloat16 sum over every token moves with the threads that summed it)."""
    outs = [close(g, w, dtype) for g, w in zip(got["outputs"], want["outputs"])]
    grads = [close(g, w, dtype) for g, w in zip(got["input_grads"], want["input_grads"])]
    wanted = (rank_plain or want)["grads"] if dtype == "bfloat16" else want["grads"]
    params = {n: close(got["grads"].get(n), w, dtype) for n, w in wanted.items()}
    what = f"mode {mode!r}"
    if all(outs) and all(grads) and all(params.values()):
        return []
    if not outs[0]:
        return [Problem(f"{what}: the module's output for the first micro-batch is not the block's (dropout on, "
                        f"training mode): its forward must compute block(x), drawing the same masks from "
                        f"block.streams in the same order (the attention's, then the two residual ones)")]
    if outs[0] and outs[1] and not (grads[0] and grads[1]):
        return [Problem(f"{what}: the outputs are the block's, but the gradients of the micro-batches in flight are "
                        f"not: the recomputation in the backward drew new dropout masks. Set block.streams' "
                        f"generators back to the states they had before that micro-batch's forward, then recompute "
                        f"(torch.utils.checkpoint's preserve_rng_state restores torch's own RNG, not the block's "
                        f"generators)")]
    if grads[0] and grads[1] and not outs[2]:
        return [Problem(f"{what}: micro-batches A and B are right, but the forward of C, after their backwards, is "
                        f"not: the recomputation left block.streams where it ended (back at an earlier "
                        f"micro-batch's masks), so the next forward redrew old masks. Put the generators' states "
                        f"back after recomputing")]
    missing = [n for n, g in got["grads"].items() if g is None]
    if missing and all(grads):
        return [Problem(f"{what}: the block's parameters got no gradient ({', '.join(sorted(missing)[:3])}, ...): "
                        f"the module must compute with the block's own parameters, not copies")]
    wrong = [f"micro-batch {'ABC'[i]}'s {k}" for k, flags in (("output", outs), ("input gradient", grads))
             for i, ok in enumerate(flags) if not ok]
    wrong += [f"{n}'s gradient" for n, ok in params.items() if not ok][:3]
    return [Problem(f"{what}: not the plain block's numbers: {', '.join(wrong)} differ")]


def memory_problems(mode: str, kept: dict, shape, dtype: str) -> list[Problem]:
    b, s, h, a = shape
    e = ITEMSIZE[dtype]
    want = kept_bytes(b, s, h, a, e, mode)
    got = kept["bytes"]
    if got <= want * (1 + SLACK) + SLACK_BYTES:
        return []           # less is no mistake here: what was recomputed to keep less is the FLOPs part's to judge
    figures = {m: kept_bytes(b, s, h, a, e, m) for m in MODES}
    nearest = min(figures, key=lambda m: abs(figures[m] - got))
    said = (f"mode {mode!r} kept {got:,} B for the backward (the lab counts what the forward left alive, autograd's "
            f"saved tensors and any other); the block under {mode!r} keeps {want:,} B here")
    if nearest != mode:
        said += f": that is what {nearest!r} keeps ({figures[nearest]:,} B)"
        if mode == "selective" and nearest == "none":
            said += (". The attention core's scores, probabilities and masks (3 a s^2 b elements) are still kept: "
                     "recompute the core (QK^T, softmax, dropout, PV) in the backward from q, k, v")
        elif mode == "full" and nearest != "full":
            said += ". Full recomputation keeps the block's input only: run the forward without keeping its graph"
    elif got > want:
        said += f": {got - want:,} B more than the mode needs"
        square = e * a * s * s * b          # one of the attention's s^2-sized tensors
        k = round((got - want) / square)
        if mode != "none" and k >= 1 and abs(got - want - k * square) <= SLACK * square + SLACK_BYTES:
            said += (f", as much as {'the' if k == 1 else k} attention's dropout mask or probabilities ({k} x a s^2 b "
                     f"elements): inside the core, recompute it rather than keep it (a mask drawn before the core and "
                     f"handed to it is kept as the core's input)")
    if kept.get("saved", 0) < got - SLACK_BYTES and got > want * (1 + SLACK) + SLACK_BYTES:
        said += f" ({got - kept.get('saved', 0):,} B of it outside autograd's saved tensors: on ctx, in a closure?)"
    return [Problem(said)]


def flop_problems(mode: str, flops: dict, shape) -> list[Problem]:
    b, s, h, _ = shape
    f = forward_flops(b, s, h)
    extra = flops["forward"] + flops["backward"] - 3 * f
    low, high = extra_flops_range(b, s, h, mode)
    if low <= extra <= high:
        return []
    said = (f"mode {mode!r}: the forward and backward counted {flops['forward'] + flops['backward']:,} matmul FLOPs, "
            f"{extra:+,} against the plain block's 3F = {3 * f:,}")
    if mode == "none":
        said += ": mode 'none' recomputes nothing"
    elif mode == "selective" and extra > high:
        said += (f"; recomputing the attention core adds at most its two products, 4bs^2h = {core_flops(b, s, h):,}: "
                 f"more than the core was recomputed")
    elif mode == "selective":
        said += ": the backward recomputed no matmul of the attention core (QK^T, PV): the core was kept, not recomputed"
    elif extra < low:
        said += f": full recomputation runs the block's forward again in the backward, F = {f:,}"
    else:
        said += f": more than one forward ({f:,}) was recomputed"
    return [Problem(said)]


def judge_run(outcome) -> dict[str, dict[str, list[Problem]]]:
    """The problems of each part, per mode of the case: {part: {mode: [Problem]}}."""
    settings = settings_of(outcome.case)
    shape = shape_of(outcome.case.config, settings)
    found = {p: {m: [] for m in settings.modes} for p in PARTS}
    obs = outcome.obs.get(0)
    if obs is None:
        return {p: {m: [Problem(f"{WHO}: the rank recorded nothing")] for m in settings.modes} for p in PARTS}
    modes = obs.get("modes") or {}
    rank_plain = (obs.get("plain") or {}).get("run")
    tampered = plain_problems(rank_plain, plain_run(outcome), settings.dtype)
    for mode in settings.modes:
        found["gradients"][mode] += tampered
        rec = modes.get(mode) or {}
        if rec.get("returned"):
            for p in PARTS:
                found[p][mode].append(Problem(f"{WHO}(block, {mode!r}) returned {rec['returned']}"))
            continue
        raised = rec.get("raised")
        if raised:
            line = f" at {raised['line']}" if raised.get("line") else ""
            problem = Problem(f"mode {mode!r}: {WHO}(block, {mode!r}) raised {raised['type']}{line}: "
                              f"{raised['message']}", gist=f"{mode} raised {raised['type']}")
            for p in PARTS:
                if p == "gradients" or (p == "memory" and "kept" not in rec) or (p == "flops" and "flops" not in rec):
                    found[p][mode].append(problem)
        elif not rec:
            for p in PARTS:
                found[p][mode].append(Problem(f"mode {mode!r}: the rank recorded nothing of it"))
        if rec.get("kept"):
            found["memory"][mode] += memory_problems(mode, rec["kept"], shape, settings.dtype)
        if rec.get("flops"):
            found["flops"][mode] += flop_problems(mode, rec["flops"], shape)
        if rec.get("run") and not raised:
            found["gradients"][mode] += gradient_problems(mode, rec["run"], plain_run(outcome), settings.dtype,
                                                          None if tampered else rank_plain)
    return found


def flat(found: dict) -> list[Problem]:
    """judge_run's problems in one list, part by part."""
    return [p for part in found.values() for problems in part.values() for p in problems]
