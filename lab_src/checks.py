"""The visible checks: what a student runs at the end of each notebook.

    from lab_src.checks import check
    report = check("q08")          # launches torchrun, compares with the baseline, prints what happened

Each check runs the student's own answers (this exercise's and the earlier ones it builds on) in real
torchrun processes on the CPU, in a few seconds, and raises `CheckFailed` with messages that name the
exercise, rank and micro-batch when something is wrong. Missing earlier answers are reported before
anything is launched. The returned `CheckReport` holds the run's events for the pictures.

These checks know the rules every correct answer obeys, not the answers themselves; the grader's
hidden tests (grader/checks/) compare with the reference answers on more configurations.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from . import answers, bubble, grid
from .config import LabConfig
from .problems import Problem, from_errors, summary
from .realness import check_layers, check_messages, check_run
from .registry import exercise
from .runner import CaseOutcome, Run, run_cases

VISIBLE = LabConfig()  # 8 layers, 4 stages, batch 8 in 4 micro-batches


class CheckFailed(AssertionError):
    pass


class CheckReport:
    """What a check found, and the events of each case it ran (for the timeline)."""

    def __init__(self, qid: str, run: Run | None, problems: list[Problem], lines: list[str], views=None):
        self.qid, self.run, self.problems, self.lines = qid, run, problems, lines
        self.views = views if views is not None else [case_view(o) for o in (run.outcomes if run else [])]

    @property
    def ok(self) -> bool:
        return not self.problems

    def events(self, case: int = 0):
        return self.views[case]["events"]

    def stages(self, case: int = 0) -> int:
        return self.views[case]["stages"]

    def microbatches(self, case: int = 0) -> int:
        return self.views[case]["microbatches"]

    def timeline(self, case: int = 0):
        """The animated P2P timeline of one case of this run (a static figure while autograding)."""
        if not self.views:
            print("No run to draw: the check did not run.")
            return None
        from .timeline import show
        v = self.views[case]
        title = v.get("title") or f"{self.qid}: {v['stages']} stages, {v['microbatches']} micro-batches"
        return show(v["events"], v["stages"], v["microbatches"], title=title,
                    activation_bytes=v.get("activation_bytes"), num_layers=v.get("num_layers"))

    def __repr__(self) -> str:
        return "\n".join(self.lines)


def case_view(outcome: CaseOutcome) -> dict:
    """What the timeline needs of one case: its events and its shape."""
    cfg = outcome.case["config"]
    return {"events": outcome.events(), "stages": outcome.case["stages"], "microbatches": cfg["num_microbatches"],
            "num_layers": cfg["num_layers"], "activation_bytes": _activation_bytes(cfg)}


def save_view(view: dict, path: Path) -> None:
    import json
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**view, "events": [e.to_row() for e in view["events"]]}))


def load_view(path: Path) -> dict:
    import json

    from .trace import Event
    view = json.loads(path.read_text())
    return {**view, "events": [Event.from_row(r) for r in view["events"]]}


def _activation_bytes(cfg: dict) -> int:
    mbs = cfg["global_batch_size"] // cfg["num_microbatches"]
    return mbs * cfg["seq_len"] * cfg["hidden_size"] * (8 if cfg["dtype"] == "float64" else 4)


def _sources(qid: str) -> dict[str, str | None]:
    ex = exercise(qid)
    ids = (*ex.needs, ex.id)
    srcs = answers.sources(ids)
    missing = [q for q in ids if srcs[q] is None]
    if missing:
        first = exercise(missing[0])
        rest = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise answers.StubCalled(answers.stub_message(first.id, caller=qid) + rest)
    return srcs


def _run_dir(qid: str) -> Path:
    return Path("runs") / f"{qid}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def _case(kind, cfg: LabConfig, srcs, qid, **extra) -> dict:
    return {"kind": kind, "stages": cfg.num_stages, "config": cfg.to_dict(), "answers": srcs, "for": qid, **extra}


def _errors(outcome: CaseOutcome, qid: str, label: str) -> list[Problem]:
    if outcome.failure:
        return [Problem(qid, outcome.failure, None, None, label)]
    return from_errors(qid, outcome.errors(), label)


def _finish(qid: str, run: Run | None, problems: list[Problem], lines: list[str]) -> CheckReport:
    report = CheckReport(qid, run, problems, lines)
    if problems:
        lines.append(f"\n{qid}: {len(problems)} problem(s)\n" + summary(problems))
    else:
        lines.append(f"\n{qid}: all checks passed")
    print("\n".join(lines))
    if problems:
        raise CheckFailed(f"{qid}: {len(problems)} problem(s)\n" + summary(problems))
    return report


def _autograding() -> bool:
    return bool(os.environ.get("NBGRADER_EXECUTION"))


# --------------------------------------------------------------------------------------------- q02
def check_q02() -> CheckReport:
    from .exercises import check_args
    srcs = _sources("q02")
    problems, lines = [], ["q02 check_args: examples"]
    examples = [((8, 4, 8, 4), {}, 2), ((8, 2, 12, 3), {}, 4), ((7, 3, 8, 4), {"allow_uneven_layers": True}, 2),
                ((8, 3, 8, 4), {}, ValueError), ((8, 4, 8, 3), {}, ValueError), ((8, 0, 8, 4), {}, ValueError),
                ((8, 4, 8, 0), {}, ValueError), ((2, 3, 6, 3), {"allow_uneven_layers": True}, ValueError)]
    for args, kwargs, want in examples:
        call = f"check_args{args}" + (" allow_uneven_layers=True" if kwargs else "")
        try:
            got = check_args(*args, **kwargs)
            ok = got == want
            lines.append(f"  {'ok ' if ok else 'BAD'} {call} -> {got!r}" + ("" if ok else f" (expected {_name(want)})"))
        except Exception as e:  # noqa: BLE001 - the student's function may raise anything
            ok = want is ValueError and isinstance(e, ValueError)
            lines.append(f"  {'ok ' if ok else 'BAD'} {call} raised {type(e).__name__}: {e}")
            if not ok and isinstance(e, AssertionError):
                lines[-1] += "  (raise ValueError: `python -O` removes assert statements)"
        if not ok:
            problems.append(Problem("q02", f"{call} should give {_name(want)}"))
    cfg = VISIBLE
    call = {"exercise": "q02", "args": [cfg.num_layers, cfg.num_stages, cfg.global_batch_size, cfg.num_microbatches]}
    run = run_cases([_case("units", cfg, srcs, "q02", calls=[call])], _run_dir("q02"))
    lines.append(f"\nIn torchrun, {cfg.num_stages} ranks each validate {cfg.describe()}:")
    out = run.outcomes[0]
    problems += _errors(out, "q02", cfg.describe())
    for r, o in sorted(out.obs.items()):
        res = o.get("results", [{}])[0]
        lines.append(f"  rank {r}: micro-batch size {res.get('value', res.get('message'))}")
    return _finish("q02", run, problems, lines)


def _name(want) -> str:
    return want.__name__ if isinstance(want, type) else repr(want)


# --------------------------------------------------------------------------------------------- q03
def check_q03() -> CheckReport:
    srcs = _sources("q03")
    cfg = VISIBLE
    problems, lines = [], [f"q03 activation_shape, {cfg.describe()}"]
    run = run_cases([_case("shapes", cfg, srcs, "q03")], _run_dir("q03"))
    out = run.outcomes[0]
    problems += _errors(out, "q03", cfg.describe())
    for r, o in sorted(out.obs.items()):
        shape = o.get("activation_shape")
        if r == 0 and "embed" in o:
            got = o["embed"]
            lines.append(f"  rank 0: the embedding of a micro-batch of tokens has shape {_shape(got)}; "
                         f"your activation_shape says {shape}")
            if got.get("value", {}).get("tensor_shape") != shape:
                problems.append(Problem("q03", f"the first stage sends a tensor of shape {_shape(got)}, "
                                               f"but receivers would allocate {shape}", 0))
        if "block" in o:
            got = o["block"]
            lines.append(f"  rank {r}: a block maps a tensor of shape {shape} to {_shape(got)}")
            if got["outcome"] != "returned" or got["value"].get("tensor_shape") != shape:
                problems.append(Problem("q03", f"a block cannot take an input of shape {shape} and give the same "
                                               f"shape back: {_shape(got)}", r))
        if "head" in o:
            lines.append(f"  rank {r} (last): the head turns it into logits of shape {_shape(o['head'])}, "
                         f"which stay on this rank")
    return _finish("q03", run, problems, lines)


def _shape(attempted: dict) -> str:
    if attempted.get("outcome") == "returned":
        v = attempted["value"]
        return str(tuple(v["tensor_shape"])) if isinstance(v, dict) and "tensor_shape" in v else repr(v)
    return f"an error ({attempted.get('type')}: {attempted.get('message', '')[:120]})"


# --------------------------------------------------------------------------------------------- q04
def check_q04() -> CheckReport:
    import torch

    from .baseline import compute_baseline
    from .data import make_dataloader
    from .model import build_model
    srcs = _sources("q04")
    cfg = VISIBLE.replace(dtype="float64")
    problems, lines = [], [f"q04 baseline_step on the whole model, {cfg.describe()}"]
    base = compute_baseline(cfg)
    out_shape = (cfg.global_batch_size, cfg.seq_len, cfg.vocab_size)
    lines.append(f"  output shape {tuple(base['output'].shape)}, loss {base['loss']:.6f}")
    if tuple(base["output"].shape) != out_shape:
        problems.append(Problem("q04", f"the output has shape {tuple(base['output'].shape)}; the whole batch "
                                       f"through the model gives {out_shape}: did you use the first batch?"))
    elif abs(float(base["output"].mean()) - base["loss"]) > 1e-9:
        problems.append(Problem("q04", f"the loss {base['loss']:.6g} is not the mean of the output "
                                       f"({float(base['output'].mean()):.6g})"))
    missing = [n for n, g in base["grads"].items() if g is None]
    if missing:
        problems.append(Problem("q04", f"{len(missing)} parameters have no gradient ({missing[0]}, ...): "
                                       f"was backward called on the loss?"))
    else:
        # a finite difference on one weight: d loss / d w, computed without autograd
        name, index, eps = "blocks.0.up.bias", 0, 1e-6
        model = build_model(cfg)
        tokens = next(iter(make_dataloader(cfg, cfg.global_batch_size)))
        with torch.no_grad():
            w = model.get_parameter(name)
            w[index] += eps
            up = float(model(tokens).mean())
            w[index] -= 2 * eps
            down = float(model(tokens).mean())
        numeric = (up - down) / (2 * eps)
        analytic = float(base["grads"][name][index])
        lines.append(f"  d loss / d {name}[{index}]: backward {analytic:.8f}, finite difference {numeric:.8f}")
        if abs(numeric - analytic) > 1e-6 + 1e-4 * abs(numeric):
            problems.append(Problem("q04", "the gradients do not belong to the loss: is the loss the mean of "
                                           "the output, and backward called once?"))
    run = run_cases([_case("baseline", cfg.replace(num_stages=2), srcs, "q04")], _run_dir("q04"))
    out = run.outcomes[0]
    problems += _errors(out, "q04", "2 ranks")
    for r, o in sorted(out.obs.items()):
        if "loss" in o:
            same = abs(o["loss"] - base["loss"]) <= 1e-9 * max(1.0, abs(base["loss"]))
            lines.append(f"  rank {r} of a 2-process torchrun: loss {o['loss']:.6f} "
                         f"({'the same' if same else 'DIFFERENT'} as in this notebook)")
            if not same:
                problems.append(Problem("q04", "ranks built from the same seed must compute the same baseline", r))
    return _finish("q04", run, problems, lines)


# --------------------------------------------------------------------------------------------- q05
def check_q05() -> CheckReport:
    srcs = _sources("q05")
    configs = [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7)]
    problems, lines = [], ["q05 distribute_layers"]
    run = run_cases([_case("layout", cfg, srcs, "q05") for cfg in configs], _run_dir("q05"))
    for cfg, out in zip(configs, run.outcomes):
        label = f"{cfg.num_layers} layers on {cfg.num_stages} stages"
        lines.append(f"\n  {label}:")
        problems += _errors(out, "q05", label)
        layers = {r: o.get("layers", []) for r, o in sorted(out.obs.items())}
        for r, ids in layers.items():
            lines.append(f"    rank {r}: blocks {ids}" + ("  + embedding" if r == 0 else "")
                         + ("  + head" if r == cfg.num_stages - 1 else ""))
        if len(layers) == cfg.num_stages:
            problems += check_layers(layers, cfg.num_layers, "q05", label)
            sizes = [len(layers[r]) for r in range(cfg.num_stages)]
            if sizes != sorted(sizes, reverse=True) or max(sizes) - min(sizes) > 1:
                problems.append(Problem("q05", f"stage sizes {sizes}: the stages should differ by at most one "
                                               f"block, the earlier stages taking the extra ones", None, None, label))
    return _finish("q05", run, problems, lines)


# --------------------------------------------------------------------------------------------- q06
def check_q06() -> CheckReport:
    srcs = _sources("q06")
    cfg = VISIBLE
    problems, lines = [], [f"q06 needs_dataloader, {cfg.num_stages} stages: each rank is fed what your "
                           f"answer says it gets (tokens from the dataloader, or the previous stage's activation)"]
    run = run_cases([_case("layout", cfg, srcs, "q06", calls=["q06"])], _run_dir("q06"))
    out = run.outcomes[0]
    problems += _errors(out, "q06", cfg.describe())
    for r, o in sorted(out.obs.items()):
        needs, feed = o.get("needs_dataloader"), o.get("feed", {})
        fed = "tokens from the dataloader" if needs else "an activation from the previous stage"
        ok = feed.get("outcome") == "returned"
        lines.append(f"  rank {r}: needs_dataloader -> {needs!r}; fed {fed}: {'works' if ok else 'FAILS'}")
        if not isinstance(needs, bool):
            problems.append(Problem("q06", f"needs_dataloader must return True or False, got {needs!r}", r))
        elif not ok:
            why = ("its stage starts from token ids, and nothing else can provide them" if not needs else
                   "its stage starts from the previous stage's activation, so the batches it would read go "
                   "unused (with a real loss the last stage would need labels; here the loss is the output's mean)")
            problems.append(Problem("q06", f"needs_dataloader says {needs}, but {why}", r))
    return _finish("q06", run, problems, lines)


# --------------------------------------------------------------------------------------------- q07
def check_q07() -> CheckReport:
    srcs = _sources("q07")
    configs = [VISIBLE.replace(num_microbatches=2, global_batch_size=4), VISIBLE.replace(num_stages=2, num_layers=4)]
    problems, lines = [], ["q07 pipeline_communicate: every rank calls the four operations in "
                           "All-Forward-All-Backward order, sending tensors labelled with sender and micro-batch"]
    run = run_cases([_case("comm", cfg, srcs, "q07") for cfg in configs], _run_dir("q07"))
    for cfg, out in zip(configs, run.outcomes):
        label = f"{cfg.num_stages} stages, {cfg.num_microbatches} micro-batches"
        lines.append(f"\n  {label}:")
        problems += _errors(out, "q07", label)
        problems += judge_comm(out, "q07", label)
        if not out.errors() and not out.failure:
            lines.append(_indent(grid.step_grid(out.events(), cfg.num_stages) if any(
                e.is_compute for e in out.events()) else _message_table(out)))
    return _finish("q07", run, problems, lines)


def judge_comm(out: CaseOutcome, qid: str, label: str) -> list[Problem]:
    """What each receive got, against what All-Forward-All-Backward implies; and the messages' rules."""
    cfg = out.case["config"]
    p, m = out.case["stages"], cfg["num_microbatches"]
    problems = []
    for r, o in sorted(out.obs.items()):
        for op, res in (o.get("probes", {}).get("noop_ends") or {}).items():
            if res["outcome"] != "returned" or res.get("value") is not None or res.get("messages"):
                end = "first" if op in ("recv_forward", "send_backward") else "last"
                got = res.get("type") or res.get("value")
                problems.append(Problem(qid, f"{op} on the {end} stage must do nothing and return None "
                                             f"(got {got!r}, {res.get('messages', 0)} messages)", r, 0, label))
        for op, mb, got in o.get("calls", []):
            if op.startswith("send"):
                if got is not None:
                    problems.append(Problem(qid, f"{op} should return None", r, mb, label))
                continue
            phase = op.split("_")[1]
            peer = r - 1 if phase == "forward" else r + 1
            if not 0 <= peer < p:
                if got is not None:
                    problems.append(Problem(qid, f"{op} has no peer on this stage and must return None", r, mb, label))
            elif got is None:
                problems.append(Problem(qid, f"{op} returned None, but this stage receives from rank {peer}", r, mb, label))
            elif got.get("from") != peer or got.get("mb") != mb or got.get("phase") != phase:
                problems.append(Problem(qid, f"{op} received {got}, expected the {phase} tensor of micro-batch {mb} "
                                             f"from rank {peer}", r, mb, label))
    if not out.errors() and not out.failure:
        shape = out.obs.get(0, {}).get("activation_shape", ())
        problems += [pr for pr in check_messages(out.events(), p, m, tuple(shape), qid, label)
                     if "forward operations" not in pr.message and "backward operations" not in pr.message]
    return problems


def _message_table(out: CaseOutcome) -> str:
    rows = []
    for r in sorted(out.obs):
        ops = [e.label() for e in out.events() if e.rank == r]
        rows.append(f"rank {r}: " + ("; ".join(ops) if ops else "(no messages)"))
    return "\n".join(rows)


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


# --------------------------------------------------------------------------------------- q08-q10
def _pipeline_check(qid: str, configs: list[LabConfig], probes: list[str]) -> CheckReport:
    from .answers import use_answers
    from .baseline import compute_baseline, load_baseline, save_baseline
    from .compare import compare_run
    srcs = _sources(qid)
    run_dir = _run_dir(qid)
    cases = []
    from .distributed import device_for
    with use_answers(srcs):
        for cfg in configs:
            base = compute_baseline(cfg, device_for(cfg.num_stages))
            path = save_baseline(base, run_dir.resolve() / f"baseline-{cfg.key()}.pt")
            cases.append(_case("pipeline", cfg, srcs, qid, baseline=str(path), probes=probes))
    run = run_cases(cases, run_dir)
    problems, lines = [], [f"{qid} {exercise(qid).function}"]
    for cfg, out, case in zip(configs, run.outcomes, cases):
        label = cfg.describe()
        lines.append(f"\n  {label}:")
        errs = _errors(out, qid, label)
        problems += errs
        if errs:
            continue
        found = compare_run(out, load_baseline(case["baseline"]), qid, label) + check_run(out, qid, label)
        if qid == "q09":
            found += judge_check_outputs(out, qid, label)
        if qid == "q10":
            found += judge_check_gradients(out, qid, label)
        problems += found
        lines.append("    outputs, loss and every stage's gradients " +
                     ("match the unsharded baseline" if not found else "DIFFER (see below)"))
        events = out.events()
        lines.append(_indent(grid.time_grid(events, cfg.num_stages)))
        lines.append("    " + bubble.describe(events, cfg.num_stages, cfg.num_microbatches))
    return _finish(qid, run, problems, lines)


def judge_check_outputs(out: CaseOutcome, qid: str, label: str) -> list[Problem]:
    p = out.case["stages"]
    problems = []
    for r, o in sorted(out.obs.items()):
        probe = o.get("probes", {}).get("check_outputs", {})
        true, disturbed = probe.get("true", {}), probe.get("disturbed")
        want = r == p - 1
        if true.get("outcome") != "returned":
            problems.append(Problem(qid, f"check_outputs raised {true.get('type')} on correct outputs: "
                                         f"{true.get('message', '')[:200]}", r, None, label))
        elif true.get("value") is not want:
            why = "the last stage holds the outputs" if want else "only the last stage has outputs to check"
            problems.append(Problem(qid, f"check_outputs returned {true.get('value')!r}; expected {want} ({why})",
                                    r, None, label))
        if disturbed is not None and (disturbed.get("outcome") != "raised" or disturbed.get("type") != "AssertionError"):
            problems.append(Problem(qid, "check_outputs accepted outputs whose last micro-batch was changed: "
                                         "compare every micro-batch (concatenate them) with the baseline, "
                                         "and let assert_close raise", r, None, label))
    return problems


def judge_check_gradients(out: CaseOutcome, qid: str, label: str) -> list[Problem]:
    problems = []
    for r, o in sorted(out.obs.items()):
        probe = o.get("probes", {}).get("check_gradients", {})
        true = probe.get("true", {})
        owned = probe.get("owned", [])
        if true.get("outcome") != "returned":
            problems.append(Problem(qid, f"check_gradients raised {true.get('type')} on correct gradients: "
                                         f"{true.get('message', '')[:200]}", r, None, label))
        elif sorted(true.get("value") or []) != sorted(owned):
            got = true.get("value") or []
            extra = sorted(set(got) - set(owned))
            lost = sorted(set(owned) - set(got))
            why = (f"it checked {extra[:2]}, which this stage does not own" if extra else
                   f"it did not check {lost[:2]}{' and more' if len(lost) > 2 else ''}")
            problems.append(Problem(qid, f"check_gradients must return the names of exactly the parameters this "
                                         f"stage owns: {why}", r, None, label))
        for key, what in (("disturbed", "a baseline gradient was changed"), ("missing", "a gradient was missing")):
            res = probe.get(key)
            if res is not None and (res.get("outcome") != "raised" or res.get("type") != "AssertionError"):
                got = "returned normally" if res.get("outcome") == "returned" else f"raised {res.get('type')}"
                problems.append(Problem(qid, f"when {what}, check_gradients {got}; it must raise AssertionError",
                                        r, None, label))
    return problems


def check_q08() -> CheckReport:
    return _pipeline_check("q08", [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7, num_microbatches=2)], [])


def check_q09() -> CheckReport:
    return _pipeline_check("q09", [VISIBLE], ["check_outputs"])


def check_q10() -> CheckReport:
    return _pipeline_check("q10", [VISIBLE], ["check_gradients"])


CHECKS = {"q02": check_q02, "q03": check_q03, "q04": check_q04, "q05": check_q05, "q06": check_q06,
          "q07": check_q07, "q08": check_q08, "q09": check_q09, "q10": check_q10}


def check(qid: str) -> CheckReport:
    """Run the visible check of exercise `qid` ("q02" ... "q10")."""
    qid = exercise(qid).id
    if _autograding():
        return autograding_report(qid)
    return CHECKS[qid]()


# Set by the grader for nbgrader's run of the notebooks: where its own runs of this submission are saved.
GRADER_TIMELINES = "LAB_GRADER_TIMELINES"


def autograding_report(qid: str) -> CheckReport:
    """While nbgrader executes a submission, checks launch nothing (the grader runs the hidden tests in
    its own processes). For the timeline, the report carries the grader's run of this answer, if saved."""
    lines = [f"{qid}: the visible check is skipped while autograding; the grader runs the hidden tests."]
    folder = os.environ.get(GRADER_TIMELINES)
    path = Path(folder) / f"{qid}.json" if folder else None
    views = []
    if path is not None and path.exists():
        views = [load_view(path)]
        lines.append(f"The timeline below is the grader's run of your answer ({views[0].get('title', '')}).")
    print("\n".join(lines))
    return CheckReport(qid, None, [], lines, views)


# --------------------------------------------------------------------------------------------- q01
def demo_seeds(num_ranks: int = 4) -> CheckReport:
    """Q1's experiment: what a seed does to the weights drawn on different ranks."""
    if _autograding():
        return autograding_report("q01")
    cfg = VISIBLE.replace(num_stages=num_ranks)
    lines = [f"{num_ranks} torchrun ranks, run seed {cfg.seed}. First numbers of each draw:",
             f"{'':8}{'manual_seed(seed)':<28}{'manual_seed(seed + rank)':<30}{'block 3 (per-piece seed)'}"]
    run = run_cases([_case("seeds", cfg, {}, "q01")], _run_dir("q01"))
    out = run.outcomes[0]
    problems = _errors(out, "q01", "seeds demo")
    for r, o in sorted(out.obs.items()):
        if "same_seed" in o:
            lines.append(f"rank {r}: {str(o['same_seed']):<28}{str(o['rank_seed']):<30}{o['block3']}")
    return _finish("q01", run, problems, lines)
