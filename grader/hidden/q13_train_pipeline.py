"""Hidden tests of q13 (train_pipeline): the student's training loop trains the digit classifier in a
real pipeline, around the reference step of the registry's `step` (q08's AFAB), and the grader trains
the single-process model on the same seed and batches, here, with reference code only.

Items in four parts (lab_src/topics/training/judge.py): the loss curves agree step by step and every
parameter trained; the loss falls by the stated margin; a real pipeline (each step judged by the
schedule model, the evaluation as forward only, tokens read on the first stage and labels on the last,
the loss reported by the last); the held-out loss and accuracy, evaluated in eval mode without autograd.
Two configurations: 4 stages in float32 for 30 steps, and 3 stages with uneven layers in float64.
"""
from lab_src.judge.problems import Problem, stamped
from lab_src.topics.training.judge import PARTS, LearningMargin, judge_training
from lab_src.topics.training.judge_run import with_known_cause
from lab_src.topics.training.digits import DIGITS

from .common import Item, case_problems, code_of

QID = "q13"

# name -> (configuration, the training case's settings, the learning margin, or None: not judged there)
CASES = {
    "4 stages, 30 steps": (DIGITS, {"steps": 30, "lr": 1e-2, "test_microbatches": 8}, LearningMargin(0.10, 5)),
    "3 stages, uneven layers, float64, seed 3": (
        DIGITS.replace(num_stages=3, num_layers=5, num_microbatches=2, global_batch_size=16, seed=3, dtype="float64"),
        {"steps": 8, "lr": 1e-2, "test_microbatches": 4}, None),
}

_expected: dict = {}
# what the single-process run depends on besides its arguments: the code of the model, data and loop
_CODE = ("lab_src.pipeline.config", "lab_src.pipeline.model", "lab_src.topics.training.digits",
         "lab_src.topics.training.classifier", "lab_src.topics.training.single_process")


def expected(name: str, mistake: str | None = None) -> dict:
    """The single-process run of case `name` (with `mistake`: for naming a wrong curve). Computed once
    per grading user and kept in the grader's own cache (grader/reference.py: mode 0700, never in a
    sandbox), under a hash of the case, the code it runs and torch's version, so grading a course
    trains it once rather than once per student."""
    key = (name, mistake)
    if key not in _expected:
        _expected[key] = _cached(name, mistake)
    return _expected[key]


def _cached(name: str, mistake: str | None) -> dict:
    import hashlib
    import json
    import os

    import torch

    from lab_src.topics.training.digits import Digits
    from lab_src.topics.training.single_process import train_single_process

    from ..reference import cache_root
    cfg, s, _ = CASES[name]
    blob = json.dumps([cfg.to_dict(), s, mistake, torch.__version__]).encode()
    blob += code_of(_CODE)
    folder = cache_root() / "q13-single-process"
    path = folder / f"{hashlib.sha256(blob).hexdigest()[:20]}.pt"
    if path.exists():
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a damaged file is recomputed
            pass
    result = train_single_process(cfg, Digits(cfg, s["test_microbatches"]), s["steps"], s["lr"], mistake)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(result, tmp)
    os.replace(tmp, path)
    return result


def cases(ctx):
    return [ctx.case(QID, "train", cfg, label=name, settings=dict(s)) for name, (cfg, s, _) in CASES.items()]


def judge(ctx, outcomes):
    items = []
    for out in outcomes:
        name = out.case.label
        margin = CASES[name][2]
        failed = stamped(with_known_cause(out, case_problems(QID, out, name)), QID, name)
        parts = [p for p in PARTS if p != "learning" or margin is not None]
        if failed:
            items += [Item(part, name, list(failed)) for part in parts]
            continue
        found = judge_training(out, expected(name), name, margin or LearningMargin(0.0, 1),
                               mistaken_curve=lambda mistake, n=name: expected(n, mistake)["losses"])
        items += [Item(part, name, stamped(found[part], QID, name)) for part in parts]
    if not items:
        items.append(Item("curves", "runs", [Problem("no training case ran", exercise=QID)]))
    return items
