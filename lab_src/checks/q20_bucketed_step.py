"""Visible check of q20 (bucketed_step): the answer's Reducer and 1F1B step on a 2 x 2 grid (two replicas of a
2-stage pipeline, tied embeddings), m = 4, two optimizer steps, a cap that makes several buckets per stage, judged by
topics/data_parallel/judge_buckets.py: the gradients against one process's, the plans, one ring per bucket per
step, and when each ring left. It prints, per rank, the plan and the launches, then the Reducer's plans for the
seed's MLP beside the prediction.

    report = check("q20")
    report.timeline()          # the last step: each rank's operations, its reducing thread in the row under it
"""
from __future__ import annotations

from pathlib import Path

from lab_src.checks.common import UNFINISHED, GridViewReport, case_view, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import stamped
from lab_src.pipeline.config import LabConfig
from lab_src.topics.data_parallel.records import (
    BUCKET_PREDICTION,
    BUCKET_PREDICTION_KEYS,
    BUCKET_TOLERANCE,
    MLP_CAP_NAMES,
    MLP_CAPS,
)

CAP = 40_000            # bytes: each stage holds 2 blocks of 50,944 B of gradients, and the embedding or the head
CFG = LabConfig(num_stages=2, num_layers=4, num_microbatches=4, global_batch_size=16, dp_size=2, seed=20,
                tie_embeddings=True)
CAP_NAMES = MLP_CAP_NAMES


def check():
    from lab_src.judge.failures import case_problems
    from lab_src.topics.data_parallel.judge_buckets import judge_run, mlp_plan_problems
    srcs = sources("q20")
    case = make_case("buckets", CFG, srcs, "q20", stages=4, label="2 x 2 grid, m = 4, two steps",
                     settings={"cap": CAP, "steps": 2, "mlp_caps": list(MLP_CAPS)}, schedule="1f1b", step="q20")
    run = run_cases([case], run_dir("q20"))
    out = run.outcomes[0]
    lines = [f"q20 bucketed_step: 2 replicas x 2 stages, m = {CFG.num_microbatches}, cap {CAP:,} B, tied embeddings, "
             f"two steps"]
    errs = stamped(case_problems(out), "q20", case.label)
    if errs:
        return finish("q20", run, errs, lines + [UNFINISHED], views=[last_step_view(out)], cls=GridViewReport)
    found = judge_run(out)
    problems = [p for part in found.values() for p in stamped(part, "q20", case.label)]
    lines.append(rank_table(out))
    plan_lines, plan_problems = mlp_lines(out, srcs.get("q20"), mlp_plan_problems)
    lines += plan_lines
    problems += stamped(plan_problems, "q20", "the seed's MLP")
    return finish("q20", run, problems, lines, views=[last_step_view(out)], cls=GridViewReport)


def last_step_view(out) -> dict:
    """The case's view (views/saved.py) with the events of its last step alone: each rank's from the moment it
    began that step (the record's clock less the case's first event, as `CaseOutcome.events` shifts them)."""
    from lab_src.pipeline.trace import Event
    view = case_view(out)
    t0 = min((row[6] for o in out.obs.values() for row in o.get("events", [])), default=0.0)
    begun = {r: o["steps"][-1]["span"][0] - t0 for r, o in out.obs.items() if o.get("steps")}
    events: list[Event] = view["events"]
    if len(begun) == out.case.stages:
        view["events"] = [e for e in events if e.t_start >= begun[e.rank] - 1e-6]
    view["dp"], view["pp"] = out.case.config.dp_size, out.case.config.num_stages
    view["title"] = "q20: the last step of each rank; its reducing thread (lane 1, your ring's messages) under it"
    return view


def rank_table(out) -> str:
    m, pp = out.case.config.num_microbatches, out.case.config.num_stages
    rows = [f"    {'rank':>4} {'replica':>7} {'stage':>5}  {'buckets: bytes each, in launch order':<40} "
            f"{'rings/step':>10} {'first ring starts in':>21} {'finish waits (ms)':>18}"]
    for r, o in sorted(out.obs.items()):
        from lab_src.topics.data_parallel.buckets import bucket_bytes
        try:
            sizes = bucket_bytes(o["params"], o["buckets"])
        except (KeyError, TypeError):
            sizes = []
        steps = o.get("steps") or [{}]
        last = steps[-1]
        rings = "/".join(str(len(s.get("launches") or [])) for s in steps)
        first = min((t for t, *_ in last.get("launches") or []), default=None)
        where = "no ring"
        if first is not None:
            inside = [b for b in last.get("backwards") or [] if b[1] <= first <= b[2]]
            where = f"backward {inside[0][0]}" if inside else \
                f"after backward {max((b[0] for b in last.get('backwards') or [] if b[2] < first), default='-')}"
        plan = f"{len(sizes)}: " + " / ".join(f"{s:,}" for s in sizes) if sizes else "?"
        ends = [b[2] for b in last.get("backwards") or [] if b[0] == m - 1]
        waited = f"{1e3 * (last['span'][1] - ends[-1]):.1f}" if ends and last.get("span") else "-"
        rows.append(f"    {r:>4} {r // pp:>7} {r % pp:>5}  {plan:<40} {rings:>10} {where:>21} {waited:>18}")
    return "\n".join(rows) + (f"\n    (a stage's last backward is micro-batch {m - 1}'s; finish waits: from its end to the "
                               f"step's, the reduction the backward did not hide, in the last step)")


def mlp_lines(out, path, judge) -> tuple[list[str], list]:
    """Your Reducer's plan of the seed's MLP under each cap, and your prediction beside it, right or wrong as the
    grader judges it: against the plan when the plan follows the rule (the grader counts the rule's buckets)."""
    from lab_src.judge.numeric import NotANumber, matches, read_numbers
    try:
        predicted = read_numbers(Path(path).read_text(errors="replace"), BUCKET_PREDICTION,
                                 BUCKET_PREDICTION_KEYS) if path else {}
    except NotANumber as e:
        predicted = None
        note = f"\n    your prediction could not be read: {e}"
    else:
        note = ""
    plans = (out.obs.get(0) or {}).get("mlp_plans") or {}
    lines = [f"\n  your Reducer on the seed's MLP (784-256-128-64-10, float32) beside your prediction, "
             f"{BUCKET_PREDICTION}() (graded: the number of buckets, exactly){note}"]
    problems = []
    for cap in MLP_CAPS:
        plan = plans.get(str(cap))
        name = CAP_NAMES[cap]
        got = len(plan) if isinstance(plan, list) else "?"
        sizes = ""
        if isinstance(plan, list):
            from lab_src.topics.data_parallel.buckets import mlp_params
            from lab_src.topics.data_parallel.records import SEED_MLP
            known = dict(mlp_params(SEED_MLP))
            sizes = " / ".join(f"{sum(known.get(n, 0) for n in b):,}" for b in plan)
        wrong_plan = judge(out.obs, cap)
        problems += wrong_plan
        line = f"    cap {name:>6}: {got} bucket{'s' if got != 1 else ''} ({sizes} B)"
        if predicted is None:
            lines.append(line)
            continue
        said = predicted.get(name)
        if said is None:
            verdict = f"no prediction: write it as \"{name}\": ... (graded)"
        elif wrong_plan:
            verdict = (f"you predicted {said:g}: not judged here until this plan follows the rule (the problem "
                       f"above says where it does not); the grader counts the rule's buckets")
        elif matches(said, got, BUCKET_TOLERANCE):
            verdict = f"you predicted {said:g}: right"
        else:
            verdict = f"you predicted {said:g}: wrong, the rule makes {got}"
        lines.append(f"{line}; {verdict}")
    extra = [k for k in predicted or {} if k not in BUCKET_PREDICTION_KEYS]
    if extra:
        lines.append(f"    not graded: {', '.join(repr(k) for k in extra)} (the keys are "
                     f"{', '.join(BUCKET_PREDICTION_KEYS)})")
    return lines, problems


__all__ = ["check"]
