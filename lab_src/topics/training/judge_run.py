"""The pipeline inside a training run (exercise q13) and its held-out evaluation: the "pipeline" and
"evaluation" parts of judge.py's verdict (judge.py's docstring says what each checks)."""
from __future__ import annotations

from dataclasses import replace


from lab_src.judge.problems import Problem, dedupe
from lab_src.judge.realness import check_built_and_ran, check_layers, check_messages, check_order
from lab_src.pipeline.schedules import FORWARD_ONLY, schedule
from lab_src.pipeline.trace import Event
from lab_src.topics.training.records import curve_tolerance, settings


def pipeline_problems(outcome, label: str) -> list[Problem]:
    case = outcome.case
    cfg, p, m = case.config, case.stages, case.microbatches
    steps = settings(case)["steps"]
    problems = check_layers({r: o.get("layers", []) for r, o in outcome.obs.items()}, cfg.num_layers)
    eval_mbs = _eval_microbatches(outcome)
    shape = tuple(outcome.obs.get(0, {}).get("activation_shape", ()))
    for r, o in sorted(outcome.obs.items()):
        spans = o.get("step_spans") or []
        calls = [s[4] for s in spans]
        if len(spans) != steps or any(c != m for c in calls):
            problems.append(Problem(f"the step ran {len(spans)} times (num_microbatches {sorted(set(calls)) or '-'}); "
                                    f"training {steps} steps of a batch in {m} micro-batches runs it {steps} times "
                                    f"with num_microbatches={m}, one call per optimizer step", rank=r))
        # each forward of the stage runs each of its pieces once: more runs are pieces run by hand
        problems += check_built_and_ran(o, r, p, len(o.get("forwards") or []))
        if r != p - 1 and o.get("returned") is not None:
            problems.append(Problem(f"a stage other than the last returned {o['returned']!r:.120}: only the "
                                    f"last stage computes the loss, so only it reports; return None here", rank=r))
        problems += _reads(o, r, p)
    problems += _labels_on_last_stage(outcome)
    sched = schedule(case.schedule)
    for k, events in enumerate(step_events(outcome)):
        if k >= steps:
            break
        found = check_messages(events, p, m, shape, sched) + check_order(events, p, m, sched)
        if found:
            problems += [replace(pr, case=f"{label}, step {k}") for pr in found]
            break                                # the first step that breaks the schedule says enough
    ev = eval_events(outcome)
    if eval_mbs and ev:
        found = check_messages(ev, p, eval_mbs, shape, FORWARD_ONLY)
        found += [Problem(why, rank=r, microbatch=mb) for r, mb, why in FORWARD_ONLY.violations(ev, p, eval_mbs)]
        problems += [replace(pr, case=f"{label}, evaluation") for pr in found]
    return dedupe(problems)


def _data(outcome):
    from lab_src.topics.training.digits import Digits
    return Digits(outcome.case.config, settings(outcome.case)["test_microbatches"])


def _eval_microbatches(outcome) -> int:
    return _data(outcome).num_test_microbatches


def _rows_of(o: dict) -> list[Event]:
    return [Event.from_row(r) for r in o.get("events", [])]


def step_events(outcome) -> list[list[Event]]:
    """Each step's events, every rank's together (a rank's k-th call of the step is step k)."""
    per_rank = {r: (_rows_of(o), o.get("step_spans") or []) for r, o in outcome.obs.items()}
    n = max((len(spans) for _, spans in per_rank.values()), default=0)
    out = []
    for k in range(n):
        events = []
        for events_r, spans in per_rank.values():
            if k < len(spans):
                events += events_r[spans[k][0]:spans[k][2]]
        out.append(events)
    return out


def eval_events(outcome) -> list[Event]:
    """The events outside every step: the evaluation's."""
    events = []
    for r, o in outcome.obs.items():
        rows, spans = _rows_of(o), o.get("step_spans") or []
        inside = set()
        for s in spans:
            inside |= set(range(s[0], s[2]))
        events += [e for i, e in enumerate(rows) if i not in inside]
    return events


def _reads(o: dict, r: int, p: int) -> list[Problem]:
    reads = o.get("reads") or {}
    problems = []
    tokens = [k for k in ("train_tokens", "test_tokens") if reads.get(k)]
    labels = [k for k in ("train_labels", "test_labels") if reads.get(k)]
    if r != 0 and tokens:
        problems.append(Problem(f"read {' and '.join(tokens)}, but only the first stage embeds pixel "
                                f"tokens; the others receive activations (q06)", rank=r))
    if r != p - 1 and labels:
        problems.append(Problem(f"read {' and '.join(labels)}, but only the last stage computes the "
                                f"loss, so only it needs the labels", rank=r))
    return problems


def _labels_on_last_stage(outcome) -> list[Problem]:
    """Every forward of the last stage inside a step must have had labels: else the step's loss was the
    mean of the class scores, q08's stand-in, not the cross-entropy."""
    p = outcome.case.stages
    o = outcome.obs.get(p - 1, {})
    forwards = o.get("forwards") or []
    for k, span in enumerate(o.get("step_spans") or []):
        unlabelled = [f for f in forwards[span[1]:span[3]] if not f.get("labelled")]
        if unlabelled:
            return [Problem(f"in step {k} the last stage ran forward without labels, so the step's loss "
                            f"was the mean of the class scores (q08's stand-in loss), not the cross-entropy. "
                            f"The loss is computed on the last stage: give it the step's labels there, "
                            f"stage.set_labels(data.train_labels(step)), before the step",
                            rank=p - 1, microbatch=unlabelled[0].get("microbatch"))]
    return []


# ---- the held-out evaluation -----------------------------------------------------------------------

def labels_left_set(outcome) -> list[Problem]:
    """The last stage ran an evaluation forward with the training labels still set: its forward returned
    each image's cross-entropy, not the class scores (torch then complains about the labels' type, or
    the stage about a micro-batch it has no labels for)."""
    p = outcome.case.stages
    o = outcome.obs.get(p - 1, {})
    forwards = o.get("forwards") or []
    spans = o.get("step_spans") or []
    after = spans[-1][3] if spans else len(forwards)
    labelled = [f for f in forwards[after:] if f.get("labelled")]
    if not spans or not labelled:
        return []
    return [Problem("the last stage still had the training labels set during the evaluation: its forward of "
                    f"held-out micro-batch {labelled[0].get('microbatch')} returned each image's cross-entropy "
                    "against the last step's labels, not the ten class scores. Call stage.set_labels(None) on "
                    "the last stage before the evaluation", rank=p - 1, microbatch=labelled[0].get("microbatch"))]


def with_known_cause(outcome, problems: list[Problem]) -> list[Problem]:
    """The problems of a training case that failed, led by the mistake the records name when they name
    one (labels left set during the evaluation), the rest as what it caused."""
    cause = labels_left_set(outcome)
    if not cause or not problems:
        return problems
    return cause + [replace(p, consequence=True) for p in problems]


def evaluation_problems(outcome, expected: dict) -> list[Problem]:
    case = outcome.case
    p = case.stages
    problems = labels_left_set(outcome)
    n_mbs = _eval_microbatches(outcome)
    for r, o in sorted(outcome.obs.items()):
        forwards = o.get("forwards") or []
        inside = set()
        for s in o.get("step_spans") or []:
            inside |= set(range(s[1], s[3]))
        outside = [f for i, f in enumerate(forwards) if i not in inside]
        if not outside:
            problems.append(Problem("no held-out evaluation ran on this rank: after training, every held-out "
                                    "micro-batch goes forward through the pipeline", rank=r))
            continue
        if len(outside) != n_mbs:
            problems.append(Problem(f"the evaluation ran {len(outside)} forwards for {n_mbs} held-out "
                                    f"micro-batches", rank=r))
        training = [f for f in outside if f.get("training")]
        grads = [f for f in outside if f.get("grad")]
        if training and grads:
            problems.append(Problem("the evaluation ran in training mode and with autograd on: call stage.eval() "
                                    "before it and stage.train() after (dropout and batch norm layers behave "
                                    "differently when evaluating), and wrap it in torch.no_grad() (else every "
                                    "forward keeps its activations for a backward that never comes)", rank=r))
            continue
        if training:
            problems.append(Problem("the evaluation ran in training mode: call stage.eval() before it (layers "
                                    "such as dropout and batch norm behave differently when evaluating; this "
                                    "model has none, but a model that has them would be judged on the wrong "
                                    "numbers), and stage.train() after", rank=r))
        if grads:
            problems.append(Problem("the evaluation ran with autograd on: wrap it in torch.no_grad(). Without "
                                    "it, every forward keeps its activations for a backward that never comes", rank=r))
    returned = outcome.obs.get(p - 1, {}).get("returned")
    if not isinstance(returned, dict):
        return problems + [Problem("the last stage returned no held-out metrics", rank=p - 1)]
    got_loss, got_acc = returned.get("test_loss"), returned.get("test_accuracy")
    data = _data(outcome)
    # the evaluation is judged on the model the ranks ended training with, whatever its training was
    trained = {n: t for o in outcome.obs.values() for n, t in (o.get("params") or {}).items()}
    from lab_src.topics.training.single_process import evaluate_parameters
    mine = evaluate_parameters(case.config, data, trained)
    want_loss, want_acc = mine if mine is not None else (expected["test_loss"], expected["test_accuracy"])
    whose = "the trained stages' model" if mine is not None else "the single-process model"
    n_images = data.num_test_microbatches * data.micro_batch_size
    if not isinstance(got_loss, float) or not isinstance(got_acc, float):
        return problems + [Problem(f"test_loss and test_accuracy must be floats, got {got_loss!r:.60} and "
                                   f"{got_acc!r:.60}", rank=p - 1)]
    rtol = max(100 * curve_tolerance(case.config.dtype), 1e-6)
    if abs(got_loss - want_loss) > rtol * abs(want_loss):
        if n_mbs > 1 and abs(got_loss / want_loss - n_mbs) < 1e-3 * n_mbs:
            why = (f"that is {n_mbs}x, and {n_mbs} is the number of held-out micro-batches: "
                   f"the held-out loss is the mean over them, not the sum")
        else:
            why = ("the mean cross-entropy of the class scores over the held-out micro-batches, in eval mode, "
                   "is what the evaluation reports")
        problems.append(Problem(f"test_loss is {got_loss:.6g}; {whose} has {want_loss:.6g} on the held-out "
                                f"images: {why}", rank=p - 1))
    if abs(got_acc - want_acc) > 1.5 / n_images:
        if abs(got_acc - want_acc * n_images) < 1.5:
            why = f"that is the number of images classified right; the accuracy is their share of the {n_images}"
        else:
            why = "the share of held-out images whose highest class score is their label is what it reports"
        problems.append(Problem(f"test_accuracy is {got_acc:.4g}; {whose} has {want_acc:.4g} on the held-out "
                                f"images: {why}", rank=p - 1))
    return problems
