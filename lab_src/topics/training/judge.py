"""Judge a training run (exercise q13) against the single-process run of the same seed and batches.

Four parts, each a list of problems:
- curves: the last stage's loss of every step equals the single process's, step by step, within
  `CURVE_RTOL`, and every parameter the single process trained moved on its rank;
- learning: the loss falls by at least the stated margin (`LearningMargin`);
- pipeline: the run is a real pipeline, judged by the schedule model: layers, pieces built and run, each
  step's messages and order by the case's schedule, the evaluation's by a forward-only program, which
  ranks read the tokens and the labels, which stage reports the loss;
- evaluation: the held-out loss and accuracy the last stage reports are those of the model the ranks
  ended training with (rebuilt here from their parameters: a mistake in training is not counted twice),
  computed in eval mode without autograd.

Why `CURVE_RTOL` is 1e-5 in float32: the pipeline computes each micro-batch's part of the batch on its
own and adds the gradients over micro-batches, the single process computes the whole batch at once, so
their sums round differently: a few units in the last place of float32 (1.2e-7) per step. Measured
over 30 steps of the 4-stage configuration (benchmarks/q13_curve_agreement.py, seeds 0 to 3): at most
1.7e-7, 1.8e-7, 2.0e-7 and 5.0e-7. Training amplifies such differences by roughly a tenth per step once
they start to grow (AdamW divides each update by the root of the running squared gradient, so near-zero
gradients turn rounding into whole updates), and over a long run they pass 1e-5 near step 65 (`make
train`): 30 graded steps stay a factor of 20 below the tolerance. Every real mistake is larger by far:
gradients never zeroed, an optimizer created every step, zeroing between micro-batches all move the loss
by 1e-3 or more from step 2 on. In float64: 1e-10.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lab_src.judge.problems import Problem
from lab_src.topics.training.judge_run import evaluation_problems, pipeline_problems
from lab_src.topics.training.records import curve_tolerance, relative_differences, settings
from lab_src.topics.training.single_process import MISTAKES

PARTS = ("curves", "learning", "pipeline", "evaluation")


@dataclass(frozen=True)
class LearningMargin:
    """The loss falls by at least `fraction`: the mean of the last `window` steps' losses is at most
    (1 - fraction) times the mean of the first `window` steps' (means, because one batch's loss is noisy)."""
    fraction: float = 0.10
    window: int = 5

    def describe(self) -> str:
        return (f"the mean loss of the last {self.window} steps is at least {self.fraction:.0%} below that of the "
                f"first {self.window}")

    def fall(self, losses: list[float]) -> float:
        head, tail = losses[:self.window], losses[-self.window:]
        return 1.0 - (sum(tail) / len(tail)) / (sum(head) / len(head))


def judge_training(outcome, expected: dict, label: str, margin: LearningMargin = LearningMargin(),
                   mistaken_curve=None) -> dict[str, list[Problem]]:
    """The problems of one training case, by part. `expected` is `train_single_process`'s result for the
    case; `mistaken_curve(name)` (optional) gives the single-process curve with one of MISTAKES, to name
    the mistake a wrong curve matches. `label`: the case's name, which the problems of one of its steps
    extend ("..., step 3"); the others name no case, the caller stamps them."""
    case = outcome.case
    p = case.stages
    found = {part: [] for part in PARTS}
    obs = outcome.obs
    last = obs.get(p - 1, {})
    returned = last.get("returned")
    losses = returned.get("losses") if isinstance(returned, dict) else None
    found["pipeline"] += merge_ranks(pipeline_problems(outcome, label))
    found["evaluation"] += merge_ranks(evaluation_problems(outcome, expected))
    if not _is_curve(losses):
        why = (f"train_pipeline returned {returned!r:.200} on the last stage; it returns a dict with the "
               f"\"losses\" of every step (floats), \"test_loss\" and \"test_accuracy\"")
        found["curves"].append(Problem(why, rank=p - 1))
        found["learning"].append(Problem("no loss curve to judge", rank=p - 1))
        return found
    updates = merge_ranks(optimizer_problems(outcome))
    found["curves"] += curve_problems(outcome, losses, expected, mistaken_curve, explained=bool(updates))
    found["curves"] += updates or merge_ranks(frozen_parameters(outcome, expected))
    fall = margin.fall(losses) if losses[0] > 0 else 0.0
    if fall < margin.fraction:
        if losses[0] > 0:
            how = (f"fell by {fall:.1%}" if fall > 0 else "did not fall") + f" over {len(losses)} steps"
        else:
            how = "is negative, so it is no cross-entropy"
        # a curve that left the single process's explains a loss that does not fall: said under it
        found["learning"].append(Problem(f"the loss {how} ({losses[0]:.4f} -> {losses[-1]:.4f}); the check "
                                         f"asks that {margin.describe()}", rank=p - 1,
                                         consequence=bool(found["curves"])))
    return found


def merge_ranks(problems: list[Problem]) -> list[Problem]:
    """One problem for each message that several ranks share ("ranks 0, 1, 2: ..."), in order (of the
    kind of the first)."""
    groups: dict[tuple, list[Problem]] = {}
    for p in problems:
        groups.setdefault((p.exercise, p.message, p.microbatch, p.case), []).append(p)
    out = []
    for (_, message, _, _), same in groups.items():
        ranks = sorted({p.rank for p in same if p.rank is not None})
        if len(ranks) > 1:
            out.append(replace(same[0], message=f"ranks {', '.join(map(str, ranks))}: {message}", rank=None))
        else:
            out.append(same[0])
    return out


def _is_curve(losses) -> bool:
    return isinstance(losses, list) and len(losses) > 0 and all(isinstance(x, float) for x in losses)


def curve_problems(outcome, losses: list[float], expected: dict, mistaken_curve=None,
                   explained: bool = False) -> list[Problem]:
    case = outcome.case
    p, m = case.stages, case.microbatches
    want = expected["losses"]
    if len(losses) != len(want):
        hint = (": one per micro-batch? Record the step's loss, which step_fn returns" if len(losses) == m * len(want)
                else "")
        return [Problem(f"{len(losses)} losses for {len(want)} steps{hint}", rank=p - 1)]
    rtol = curve_tolerance(case.config.dtype)
    diffs = relative_differences(losses, want)
    bad = next((k for k, d in enumerate(diffs) if d > rtol), None)
    if bad is None:
        return []
    head = (f"the loss curve leaves the single process's at step {bad}: {losses[bad]:.6g} instead of "
            f"{want[bad]:.6g} (relative difference {diffs[bad]:.1e}, tolerance {rtol:.0e})")
    if bad == 0:
        ratio = losses[0] / want[0] if want[0] else 0.0
        if abs(ratio - m) < 1e-3 * m and m > 1:
            why = (f"the reported loss is {m}x the batch's: the step's loss is already the mean over the "
                   f"batch; report it as step_fn returns it")
        elif abs(ratio * m - 1) < 1e-3 and m > 1:
            why = f"the reported loss is 1/{m} of the batch's: report the step's loss as step_fn returns it"
        else:
            why = ("the first step's loss comes before any update, so the data or the loss differ: the last "
                   "stage needs the labels of the same step and micro-batches as the first stage's tokens")
        return [Problem(f"{head}. {why}", rank=p - 1)]
    named = None if explained else _matching_mistake(losses, mistaken_curve, rtol)
    if explained:
        why = "the optimizer's steps, below, say why"
    elif named:
        why = f"it matches, step by step, a single-process run in which {MISTAKES[named]}"
    else:
        why = ("step 0 agrees, so the forward pass, the loss and the labels are right; what changes from then "
               "on is the update: one AdamW over this stage's parameters with learning rate lr and PyTorch's "
               "defaults, created once; gradients zeroed once per step, before the step's backward; "
               "optimizer.step() after the step")
    return [Problem(f"{head}. {why}", rank=p - 1)]


def _matching_mistake(losses, mistaken_curve, rtol: float) -> str | None:
    if mistaken_curve is None:
        return None
    for name in MISTAKES:
        curve = mistaken_curve(name)
        if curve is not None and len(curve) == len(losses) and \
                max(relative_differences(losses, curve)) <= max(100 * rtol, 1e-4):
            return name
    return None


def optimizer_problems(outcome) -> list[Problem]:
    """What the optimizer steps of each rank saw (topics/training/kind.py, OptimizerWatch), against the contract:
    one AdamW per rank, created once, over exactly this stage's parameters, with learning rate lr and
    PyTorch's defaults, stepping once per training step while the step's gradients are there."""
    case = outcome.case
    s = settings(case)
    steps, lr = s["steps"], s["lr"]
    defaults = [lr, [0.9, 0.999], 1e-8, 0.01, False]
    problems = []
    for r, o in sorted(outcome.obs.items()):
        rec = o.get("optimizer")
        if not rec:
            continue
        found = []
        if rec["steps"] == 0:
            found.append("optimizer.step() never ran on this rank: without it the stage's parameters never change")
        elif rec["steps"] != steps:
            found.append(f"optimizer.step() ran {rec['steps']} times for {steps} training steps: once per step, after "
                         f"the step has brought every micro-batch's gradient")
        if rec["created"] > 1:
            found.append(f"{rec['created']} optimizers stepped: {MISTAKES['fresh_optimizer']}")
        if rec["types"] and rec["types"] != ["AdamW"]:
            found.append(f"the optimizer is {', '.join(rec['types'])}; the exercise asks for torch.optim.AdamW")
        if rec["foreign_held"]:
            found.append(f"the optimizer holds {rec['foreign_held']} tensors that are not this stage's parameters: "
                         f"an optimizer over a whole model built on every rank? It updates tensors the pipeline "
                         f"never uses. Each rank's AdamW holds stage.parameters(), and only those")
        if rec["own_held"] is not None and rec["own_held"] < rec["own"]:
            found.append(f"the optimizer holds {rec['own_held']} of this stage's {rec['own']} parameters: the others "
                         f"never train. Give it all of stage.parameters()")
        if rec["steps"] and rec["steps_without_grads"] == rec["steps"]:
            found.append(f"when optimizer.step() ran, none of this stage's parameters had a gradient: "
                         f"{MISTAKES['zeroed_before_update']}")
        wrong = [st for st in rec["settings"] if not _same_settings(st, defaults)]
        if wrong:
            got = wrong[0]
            found.append(f"AdamW runs with lr={got[0]:g}, betas={tuple(got[1])}, eps={got[2]:g}, "
                         f"weight_decay={got[3]:g}, amsgrad={got[4]}; the exercise asks for lr={lr:g} and PyTorch's "
                         f"defaults (betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01), as the single process uses")
        problems += [Problem(text, rank=r) for text in found]
    return problems


def _same_settings(got, want) -> bool:
    lr, betas, eps, wd, ams = got
    return (abs(lr - want[0]) <= 1e-12 * max(1.0, abs(want[0])) and list(betas) == want[1] and eps == want[2]
            and wd == want[3] and ams == want[4])


def frozen_parameters(outcome, expected: dict) -> list[Problem]:
    """Parameters that training never moved on their rank, though the single process moved them: the
    optimizer does not hold them."""
    from lab_src.pipeline.model import build_piece
    cfg = outcome.case.config
    problems = []
    for r, o in sorted(outcome.obs.items()):
        params = o.get("params") or {}
        if not params:
            continue
        pieces = {}
        frozen = []
        for name, value in params.items():
            piece = name.split(".")[0] if not name.startswith("blocks.") else ".".join(name.split(".")[:2])
            if piece not in pieces:
                pieces[piece] = dict(build_piece(cfg, piece).named_parameters())
            initial = pieces[piece][name[len(piece) + 1:]].detach().to(value.dtype)
            trained = expected["params"].get(name)
            if trained is not None and not torch.equal(trained, initial) and torch.equal(value, initial):
                frozen.append(name)
        if frozen:
            which = ("none of this stage's parameters changed" if len(frozen) == len(params) else
                     f"{len(frozen)} of this stage's {len(params)} parameters never changed "
                     f"({', '.join(frozen[:3])}{' ...' if len(frozen) > 3 else ''})")
            problems.append(Problem(f"{which} during training: the optimizer of this rank does not hold "
                                    f"them. Create one AdamW over stage.parameters(), the parameters this rank "
                                    f"owns (an optimizer over a whole model built on every rank updates "
                                    f"tensors that the pipeline never uses)", rank=r))
    return problems


# ---- a real pipeline, by the schedule model ------------------------------------------------------
