"""What the hidden tests share: the grading configurations, the context of one submission, and items.

Each hidden test (grader/hidden/qNN_*.py) defines
    cases(ctx)          the check cases to run: the graded exercise uses the student's answer, every
                        other exercise the reference, so one mistake costs points once;
    judge(ctx, outcomes) the items that passed or failed, grouped in parts.
The score of an exercise is the mean over its parts of the share of items passed.

Judging happens in the grading process, which never runs student code: it reads what the ranks
observed and compares it with what the reference answers, run here, produce.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from lab_src.harness.baselines import Baselines
from lab_src.harness.case import Case
from lab_src.harness.groups import device_for
from lab_src.harness.kinds import exercises_called
from lab_src.judge import failures
from lab_src.judge.problems import Kind, Problem, stamped
from lab_src.pipeline.config import LabConfig
from lab_src.registry import exercise

# Several configurations, so that an answer right by accident for one shape fails another. Simplest
# first: cases run in this order, and an exercise whose cases keep deadlocking or crashing stops being
# tried after two (lab_src/harness/worker.py, lab_src/harness/runner.py), so the cases it can pass should come early.
CONFIGS = {
    "a single stage": LabConfig(num_stages=1, num_layers=3, num_microbatches=2, global_batch_size=4),
    "one micro-batch": LabConfig(num_stages=2, num_layers=4, num_microbatches=1, global_batch_size=4),
    "fewer micro-batches than stages": LabConfig(num_stages=3, num_layers=6, num_microbatches=2, global_batch_size=4),
    "more micro-batches than stages": LabConfig(num_stages=4, num_layers=8, num_microbatches=6, global_batch_size=12),
    "uneven layers, seed 7": LabConfig(num_stages=3, num_layers=7, num_microbatches=4, global_batch_size=8, seed=7),
    "float64, seed 123": LabConfig(num_stages=4, num_layers=8, num_microbatches=4, global_batch_size=8, seed=123,
                                   dtype="float64"),
}

@dataclass
class Item:
    part: str
    name: str
    problems: list[Problem] = field(default_factory=list)

    credit: float = 0.0      # the share an item keeps when all its problems are Kind.WRONG_SCHEDULE

    @property
    def passed(self) -> bool:
        return not self.problems

    @property
    def score(self) -> float:
        if not self.problems:
            return 1.0
        if all(p.kind is Kind.WRONG_SCHEDULE for p in self.problems):
            return self.credit
        return 0.0


@dataclass
class Context:
    student: dict[str, str | None]          # qid -> the student's answer file (None: missing)
    reference: dict[str, str]               # qid -> the reference answer file
    folder: Path | None = None              # where the baselines that ranks load are written
    baselines: Baselines = field(init=False)   # the reference's baselines, by configuration
    _ref_modules: dict = field(default_factory=dict)

    def __post_init__(self):
        # every graded case runs in one launch of 4 processes (grader/trusted.py): the baselines compute where it does
        self.baselines = Baselines(self.reference, self.folder, device_for(4))

    def answers(self, qid: str) -> dict[str, str | None]:
        """Reference answers everywhere except `qid`, which is the student's."""
        return {**self.reference, qid: self.student.get(qid)}

    def case(self, qid: str, kind: str, config: str | LabConfig | None = None, stages: int | None = None,
             **extra) -> Case:
        """A case of `kind` on the named grading configuration (or a configuration of its own, named by
        `label`), testing the student's answer to `qid`. It runs the step of `qid`'s exercise and is judged
        against its schedule, unless `step` and `schedule` (a variant of it: "interleaved:4", q15's with 4
        chunks per rank) say otherwise; a pipeline case whose probes load the baseline carries its file."""
        if isinstance(config, LabConfig):
            cfg, config = config, None
        else:
            cfg = CONFIGS[config] if config else LabConfig(num_stages=stages or 1)
        ex = exercise(qid)
        extra = {"label": config or kind, "schedule": ex.schedule_of_step, "step": ex.step_exercise, **extra}
        if kind == "pipeline":
            extra.setdefault("baseline", self.baselines.for_case(cfg, extra.get("probes", ())))
        called = exercises_called(kind, extra["step"], extra.get("calls", ()))
        answers = {q: path for q, path in self.answers(qid).items() if q in called | {qid}}
        return Case(kind=kind, qid=qid, config=cfg, answers=answers, stages=stages or 0, **extra)

    def reference_fn(self, qid: str):
        """The reference function of `qid`, imported into this (trusted) process."""
        if qid not in self._ref_modules:
            from lab_src.registry import exercise
            spec = importlib.util.spec_from_file_location(f"reference_{qid}", self.reference[qid])
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            self._ref_modules[qid] = getattr(module, exercise(qid).function)
        return self._ref_modules[qid]


def code_of(modules: tuple[str, ...]) -> bytes:
    """The source of `modules` (dotted names), for the key of a result computed from what they run (q13's and
    q18's single-process curves, cached per grading user): a change to that code computes it again."""
    return b"".join(Path(importlib.util.find_spec(m).origin).read_bytes() for m in modules)


def case_problems(qid: str, outcome, label: str) -> list[Problem]:
    """A case that did not complete, or raised on some rank, as problems (empty when it ran cleanly):
    the causes first, then what they caused (lab_src/judge/failures.py)."""
    return stamped(failures.case_problems(outcome), qid, label)


def pipeline_item(qid: str, ctx: Context, outcome, part: str = "pipelines", extra=None) -> Item:
    """A full pipeline run compared with the reference baseline, plus the checks that it is real and
    that each stage holds the layers the reference assigns it; `extra(outcome)`: more problems of the run."""
    from lab_src.judge.realness import check_run
    label = outcome.case.label
    item = Item(part, label, case_problems(qid, outcome, label), credit=exercise(qid).other_schedule_credit)
    if item.problems:
        return item
    cfg = outcome.case.config
    item.problems += stamped(compare_numbers(ctx, outcome) + check_run(outcome), qid, label)
    ref_layers = ctx.reference_fn("q05")
    for r, o in sorted(outcome.obs.items()):
        want = ref_layers(cfg.num_layers, r, cfg.num_stages)
        if o.get("layers") != want:
            item.problems.append(Problem(f"this stage owns blocks {o.get('layers')}; it should own {want}",
                                         exercise=qid, rank=r, case=label))
    if extra is not None:
        item.problems += stamped(extra(outcome), qid, label)
    return item


def compare_numbers(ctx: Context, outcome) -> list[Problem]:
    """The run compared with its baseline: on a case where rank 0 changed its embedding after building it
    (pipeline/perturb.py, `pipeline_cases`), the baseline of the changed model, and outputs that ignored the
    change are named first (judge/compare.py `check_depends`)."""
    from lab_src.judge.compare import check_depends, compare_run
    cfg = outcome.case.config
    seed = outcome.obs.get(0, {}).get("perturbed")
    if not outcome.case.settings.get("perturb"):
        return compare_run(outcome, ctx.baselines[cfg])
    if seed is None:
        return [Problem("stage 0 did not report the change the grader made to its embedding", rank=0)]
    ignored = check_depends(outcome, ctx.baselines[cfg])
    return ignored or compare_run(outcome, ctx.baselines.perturbed(cfg, seed))


def pipeline_cases(ctx: Context, qid: str, configs: dict[str, LabConfig] | None = None) -> list[Case]:
    """A pipeline case of `qid` on each grading configuration (or each of `configs`, by label); in every
    case of 2 stages or more, rank 0 changes its embedding right after building it, and the outputs must
    follow (pipeline/perturb.py). Every such case, so that an answer cannot tell which one carries it."""
    if configs is None:
        return [ctx.case(qid, "pipeline", c, settings=perturbing(CONFIGS[c])) for c in CONFIGS]
    return [ctx.case(qid, "pipeline", cfg, label=label, settings=perturbing(cfg)) for label, cfg in configs.items()]


def perturbing(cfg: LabConfig) -> dict:
    """A pipeline case's settings: rank 0 changes its embedding once built where there is a later stage."""
    return {"perturb": True} if cfg.num_stages > 1 else {}


def causes_first(item: Item) -> Item:
    """The item's problems with where ranks waited (Kind.WAIT) last: when one rank raises, its
    neighbours wait until they time out, and the raise is what the student needs to read first."""
    item.problems.sort(key=lambda p: p.kind is Kind.WAIT)
    return item


def units_case(ctx: Context, qid: str, label: str, calls: list[tuple]) -> dict:
    """A case that calls the student's function of `qid` directly, on rank 0: calls = [(args, kwargs)]."""
    def encode(v):
        return {"$cfg": v.to_dict()} if isinstance(v, LabConfig) else v
    return ctx.case(qid, "units", label=label,
                    calls=[{"exercise": qid, "args": [encode(a) for a in args], "kwargs": kwargs} for args, kwargs in calls])


def unit_items(ctx: Context, qid: str, outcome, calls: list[tuple], group=None) -> list[Item]:
    """One item per call (or per `group(args, kwargs)` of calls), passed when the student's function
    returns what the reference returns, or raises the same exception type."""
    from lab_src.registry import exercise
    ref, fn, part = ctx.reference_fn(qid), exercise(qid).function, outcome.case.label
    items: dict[str, Item] = {}
    for (args, kwargs), got in zip(calls, _unit_results(outcome, len(calls))):
        call = f"{fn}({', '.join('cfg' if isinstance(a, LabConfig) else repr(a) for a in args)}" + \
            "".join(f", {k}={v!r}" for k, v in kwargs.items()) + ")"
        name = group(args, kwargs) if group else call
        item = items.setdefault(name, Item(part, name))
        if item.problems:
            continue  # a group shows its first wrong call
        want, exc = call_reference(ref, args, kwargs)
        if not _same_result(got, want, exc):
            hint = (" (raise ValueError: `python -O` removes assert statements)"
                    if exc is ValueError and got.get("type") == "AssertionError" else "")
            expected = f"a {exc.__name__}" if exc else repr(want)
            item.problems.append(Problem(f"{call} {describe_result(got)}; expected {expected}{hint}", exercise=qid))
    return list(items.values())


def _unit_results(outcome, n: int) -> list[dict]:
    """The rank-0 results of a 'units' case, one per call (a failed case gives failures everywhere)."""
    o = outcome.obs.get(0, {})
    results = o.get("results")
    if outcome.failure or o.get("error") or results is None or len(results) != n:
        why = outcome.failure or (o.get("error") or {}).get("message", "the calls did not run")
        return [{"outcome": "raised", "type": "NotRun", "message": why}] * n
    return results


def _same_result(got: dict, want, want_exc: type | None) -> bool:
    if want_exc is not None:
        return got.get("outcome") == "raised" and got.get("type") == want_exc.__name__
    value = got.get("value")
    if isinstance(want, tuple):
        want = list(want)
    return got.get("outcome") == "returned" and type(value) is type(want) and value == want


def call_reference(fn, args, kwargs):
    try:
        return fn(*args, **kwargs), None
    except Exception as e:  # noqa: BLE001 - the reference raising is the expected answer
        return None, type(e)


def describe_result(got: dict) -> str:
    if got.get("outcome") == "returned":
        return f"returned {got.get('value')!r}"
    return f"raised {got.get('type')}: {shortened(str(got.get('message', '')))}"


def shortened(text: str, limit: int = 160) -> str:
    """`text` within `limit` characters, cut where it reads whole: after its last whole sentence, else before
    its first parenthesis, else at a word ("... yours takes (num_layers, pp_rank)", "... while it loaded
    (...)", never "... a rank exited during the ; expected 2")."""
    if len(text) <= limit:
        return text
    head = text[:limit + 1]
    if ". " in head:
        return head[:head.rindex(". ")]
    if " (" in head[20:]:
        return head[:head.index(" (", 20)] + " (...)"
    return head[:limit].rsplit(" ", 1)[0] + " ..."


def judge_prediction(ctx, qid: str, name: str, want: dict, wrong, keys=None, close=None, names=None) -> list[Item]:
    """The graded prediction of `qid`: an item "prediction" per figure of `want` ({key: the figure}), each failed
    where the answer's function `name` gives no such entry, or a number not `close` to the figure (default:
    lab_src/judge/numeric.py `matches`), with `wrong(key, got, want)`'s message (what the figure is, and where the
    data tell it, which wrong count the number is). `keys`: as `read_prediction`'s; `names`: {key: the item's name}
    where it is not the key."""
    from lab_src.judge.numeric import matches
    close = close or matches
    names = names or {}
    items = [Item("prediction", names.get(k, k)) for k in want]
    got = read_prediction(ctx, qid, name, items, keys)
    if got is None:
        return items
    for item, k in zip(items, want):
        if item.name not in got:
            item.problems.append(Problem(f"{name}() gives no {item.name!r} entry", exercise=qid))
        elif not close(got[item.name], want[k]):
            item.problems.append(Problem(wrong(k, got[item.name], want[k]), exercise=qid))
    return items


def read_prediction(ctx, qid: str, name: str, items: list[Item], keys=None) -> dict | None:
    """The numbers the answer cell's function `name` returns (lab_src/judge/numeric.py reads them, never runs
    them), or None after putting on every item of `items` why they could not be read (with `keys`, the
    prediction's, the message shows the form the answer takes)."""
    from lab_src.judge.numeric import NotANumber, read_numbers
    path = ctx.student.get(qid)
    try:
        return read_numbers(Path(path).read_text(errors="replace"), name, keys) if path else {}
    except NotANumber as e:
        for item in items:
            item.problems.append(Problem(f"the prediction could not be read: {e}", exercise=qid))
        return None
