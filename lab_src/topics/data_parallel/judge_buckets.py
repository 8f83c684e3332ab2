"""Parent side of q20 (bucketed_step): judge what the ranks of a buckets case recorded (kind_buckets.py).

Four parts, each read from behaviour, never from the answer's form:
    values      every replica's gradients after each optimizer step equal one process's over the global batch
                (the unsharded model, the same SGD steps), a scale named by its factor
    plan        the Reducer's buckets on every stage (and on the seed's MLP) have the three properties of the
                rule's plan (buckets.py `plan_problems`)
    rings       per rank and step, one launch per bucket, of the plan's bytes, in the plan's order
    placement   no launch before the stage's last backward of the step begins; on the last stage a launch
                before that backward ends (the reduction overlaps the other stages' cool-down)
"""
from __future__ import annotations

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge import wire
from lab_src.judge.compare import close, scale_between
from lab_src.judge.grid_baseline import grid_baseline_grads
from lab_src.judge.problems import Problem, first_wrong_steps
from lab_src.pipeline.config import TIED_NAMES
from lab_src.topics.data_parallel.buckets import bucket_bytes, plan_problems


def baseline_grads(case) -> list[dict]:
    """One process's gradients at each of the case's steps (judge/grid_baseline.py)."""
    return grid_baseline_grads(case, settings_of(case).steps)


def explain(c: float | None, dp: int, m: int, got, want, step: dict, mb_last: int) -> str:
    if c is not None and dp > 1 and abs(c - dp) < 1e-3 * dp:
        return (f"your gradients are {dp}x the reference's, and {dp} is dp.size: the buckets were summed over the "
                f"replicas and never divided by dp.size")
    if c is not None and dp > 1 and abs(c - 1 / dp) < 1e-3 / dp:
        return (f"your gradients are 1/{dp} of the reference's: averaged twice (divided by dp.size in the bucket "
                f"and again in finish, or once per step and once more)")
    if c is not None and m > 1 and abs(c - m) < 1e-3 * m:
        return f"your gradients are {m}x the reference's, and {m} is the number of micro-batches"
    if c is not None and abs(c - 1) > 1e-3:
        return f"your gradients are {c:.3g}x the reference's"
    largest = f"largest difference {float((got - want).abs().max()):.3g}"
    launches = step.get("launches") or []
    if not launches and dp > 1:
        return (f"{largest}. This rank launched no bucket in this step: its gradients are its own replica's shard's, "
                f"never averaged with the other replicas'")
    last = [b for b in step.get("backwards") or [] if b[0] == mb_last - 1]
    if last and launches and min(t for t, *_ in launches) < last[-1][1]:
        return (f"{largest}. Buckets left before the stage's last backward began: the micro-batches whose backward "
                f"ran after them are missing from the average, and what those backwards added was overwritten by "
                f"finish()")
    if launches:
        return (f"{largest}. The buckets were launched after the last backward began, but the gradients are not "
                f"their average: does finish() wait for every bucket and write its sum / dp.size back into each "
                f"parameter's .grad, every step?")
    return largest


def tied_cause(step: dict) -> str:
    sums = step.get("tied_sums") or []
    if not sums:
        return ("it was never summed over this replica's first and last stage (dp.sum_tied in finish), so each copy "
                "holds only its own use's gradient")
    if not all(waited for _, _, waited in sums):
        return ("it was summed over the first and last stage while its bucket was still being reduced, and finish() "
                "then wrote the bucket's average back over the sum: the other stage's use is lost. Sum the tied "
                "gradient once every bucket is written back (Megatron-LM #844: the tied reduction ordered against "
                "the data-parallel one)")
    if len(sums) > 1:
        return f"it was summed over the first and last stage {len(sums)} times in one step"
    return "it was summed once, after the buckets, but is not the sum of the two uses' averaged gradients"


# the gists of an early launch (the cause, said once whatever the stage) and of the gradients it left wrong (said under it)
EARLY = "a bucket launched before the stage's last backward began"
EARLY_VALUES = "the gradients an early launch left wrong"
EARLY_TIED = "the tied gradient an early launch left wrong"


def value_problems(outcome, early_step: int | None = None) -> list[Problem]:
    """Each rank's gradients after each step against one process's. A rank is charged for its first wrong step;
    where another rank went wrong in an earlier step, the SGD step spread that into every weight, and the later
    difference is its consequence. `early_step`: the first step in which a stage launched a bucket before its last
    backward began (placement_problems): a wrong step from then on is that launch's consequence, said under it, the
    tied embedding's apart (its other use's share was reduced early on the other stage)."""
    case, obs = outcome.case, outcome.obs
    want_steps = baseline_grads(case)
    dp, m = case.config.dp_size, case.config.num_microbatches
    first: dict[int, tuple[int, Problem]] = {}
    for r, o in sorted(obs.items()):
        for k, step in enumerate(o.get("steps") or []):
            got, want = step.get("grads") or {}, want_steps[k]
            none = [n for n in want if n in got and got[n] is None]
            if none:
                first[r] = (k, Problem(f"step {k}: {len(none)} parameters have no gradient ({none[0]}, ...)", rank=r))
                break
            wrong = [n for n in got if n in want and not close(got[n], want[n])]
            caused = early_step is not None and k >= early_step
            if wrong and set(wrong) <= set(TIED_NAMES) and case.config.tie_embeddings:
                why = (("the share of it summed on the stage that launched early (above) was missing the later "
                        "micro-batches, so the sum of the two uses is wrong too") if caused else tied_cause(step))
                first[r] = (k, Problem(f"after step {k}, the tied embedding's gradient ({wrong[0]}) differs from one "
                                       f"process's, every other gradient being right: " + why, rank=r,
                                       consequence=caused, gist=EARLY_TIED if caused else ""))
                break
            if wrong:
                g = torch.cat([got[n].reshape(-1).double() for n in wrong])
                w = torch.cat([want[n].reshape(-1).double() for n in wrong])
                first[r] = (k, Problem(
                    f"after step {k}, {len(wrong)} of {len(got)} gradients differ from one process's over the global "
                    f"batch ({', '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}): "
                    + explain(scale_between(g, w), dp, m, g, w, step, m), rank=r,
                    consequence=caused, gist=EARLY_VALUES if caused else ""))
                break
    return first_wrong_steps(first, lambda k, earliest, cause: (
        f"after step {k} the gradients differ, step {earliest}'s having been right on this rank: rank {cause}'s "
        f"wrong gradients of step {earliest} went into its weights with the SGD step, and every later step starts "
        f"from other weights"))


def stage_plan_problems(outcome) -> list[Problem]:
    problems = []
    cap = settings_of(outcome.case).cap
    for r, o in sorted(outcome.obs.items()):
        if "params" not in o:
            continue
        found = plan_problems(o["params"], o.get("buckets"), cap)
        if found:
            problems.append(Problem(f"the plan of stage {r % outcome.case.config.num_stages} under a cap of "
                                    f"{cap:,} B: {found[0]}", rank=r))
    return problems


def mlp_plan_problems(obs: dict, cap: int) -> list[Problem]:
    """The Reducer's plan for the seed's MLP under `cap`, as rank 0 recorded it."""
    from lab_src.topics.data_parallel.buckets import mlp_params
    from lab_src.topics.data_parallel.records import SEED_MLP
    o = obs.get(0, {})
    plans = o.get("mlp_plans") or {}
    if str(cap) not in plans:
        return [Problem(f"no plan for the seed's MLP under {cap:,} B was recorded")]
    params = [(n, b, True) for n, b in mlp_params(SEED_MLP)]
    found = plan_problems(params, plans[str(cap)], cap)
    return [Problem(f"the seed's MLP under a cap of {cap:,} B: {found[0]}", rank=0)] if found else []


def ring_problems(outcome) -> list[Problem]:
    """One launch per bucket per step, of the plan's bytes, in its order; the same launches on every replica."""
    problems = []
    for r, o in sorted(outcome.obs.items()):
        buckets = o.get("buckets")
        if not isinstance(buckets, list) or "params" not in o:
            continue
        try:
            want = bucket_bytes(o["params"], buckets)
        except KeyError:
            continue          # the plan names other parameters: the plan part says so
        for k, step in enumerate(o.get("steps") or []):
            got = [b for _, b, _ in step.get("launches") or []]
            if step.get("collectives"):
                name = step["collectives"][0].removeprefix("dist_")     # the event kind: torch's function (comm/collectives.py)
                problems.append(Problem(f"step {k}: the reducer called a collective of torch.distributed ({name}): "
                                        f"every bucket goes through dp.launch, whose thread sums it with your q19 "
                                        f"ring", rank=r))
                break
            if got == want:
                continue
            if not got:
                why = ("no bucket was launched: the hooks never fired while armed (is reducer.arm() called before "
                       "the stage's last backward?), or finish() reduced without dp.launch")
                if r % outcome.case.config.num_stages == outcome.case.config.num_stages - 1:
                    why += (". On the last stage 1F1B has no cool-down: its last backward is the steady state's "
                            "last, so an arm() placed in the cool-down never runs there")
            elif len(got) == len(want) * outcome.case.config.num_microbatches:
                why = (f"{len(got)} launches for {len(want)} buckets: every bucket was reduced once per micro-batch "
                       f"({outcome.case.config.num_microbatches}); arm only before the last backward, and disarm "
                       f"in finish")
            elif len(got) > len(want):
                why = f"{len(got)} launches for {len(want)} buckets: a bucket was reduced more than once"
            elif sorted(got) == sorted(want):
                why = (f"the buckets were launched in another order than the plan's ({got} B against {want} B): "
                       f"launch a bucket only when every bucket before it has been launched, so that every "
                       f"replica's k-th ring carries the same bucket")
            else:
                why = f"the launches carried {got} B; the plan's buckets hold {want} B, in that order"
            problems.append(Problem(f"step {k}: {why}", rank=r))
            break
    return problems


def early_step(outcome) -> int | None:
    """The first step in which some stage launched a bucket before its last backward began (from the record)."""
    m = outcome.case.config.num_microbatches
    steps = []
    for o in outcome.obs.values():
        for k, step in enumerate(o.get("steps") or []):
            last = [b for b in step.get("backwards") or [] if b[0] == m - 1]
            if last and any(t < last[-1][1] for t, *_ in step.get("launches") or []):
                steps.append(k)
                break
    return min(steps, default=None)


def placement_problems(outcome) -> list[Problem]:
    """From the record: each launch's time against the stage's last backward of its step."""
    case = outcome.case
    m, pp = case.config.num_microbatches, case.config.num_stages
    problems = []
    for r, o in sorted(outcome.obs.items()):
        p = r % pp
        for k, step in enumerate(o.get("steps") or []):
            launches = step.get("launches") or []
            last = [b for b in step.get("backwards") or [] if b[0] == m - 1]
            if not last or (not launches and p != pp - 1):
                continue
            _, start, end = last[-1]
            early = [t for t, *_ in launches if t < start]
            if early:
                before = sum(1 for b in step["backwards"] if b[2] <= early[0])
                problems.append(Problem(
                    f"step {k}: stage {p} launched a bucket before its last backward (micro-batch {m - 1}'s) began, "
                    f"after {before} of its {m} backwards: the gradients of the later micro-batches were not in "
                    f"it yet. Arm the reducer just before the stage's last backward (not on its last forward: on "
                    f"stage {p}, 1F1B runs {_backwards(min(pp - p - 1, m))} between its last forward and its last "
                    f"backward)",
                    rank=r, gist=EARLY))
                break
            if p == pp - 1 and not launches:
                problems.append(Problem(f"step {k}: the last stage launched no bucket, so nothing of the reduction "
                                        f"overlapped its backward", rank=r))
                break
            if p == pp - 1 and min(t for t, *_ in launches) > end:
                problems.append(Problem(
                    f"step {k}: the last stage launched its first bucket {1e3 * (min(t for t, *_ in launches) - end):.1f} "
                    f"ms after its last backward ended: nothing of the reduction overlapped the backward. Launch "
                    f"each bucket from the hooks as soon as it is full, during the backward, not in finish()",
                    rank=r))
                break
    return problems


def journal_problems(outcome) -> list[Problem]:
    """The record's launch times held against the journal the launching process read as the run went
    (CaseOutcome.order): `dp.launch` journals a line when it is called, in order with the backwards' begins and
    ends. A record that says a bucket was launched during the stage's last backward where the journal has no
    launch between that backward's begin and end was written after the fact."""
    case = outcome.case
    m, pp = case.config.num_microbatches, case.config.num_stages
    problems = []
    for r, o in sorted(outcome.obs.items()):
        order = outcome.order.get(r)
        if not order or o.get("error"):
            continue
        during, inside, count = [], False, 0
        for tag, kind, number in order:
            if kind == "backward" and number == m - 1:
                if tag == "B":
                    inside, count = True, 0
                elif tag == "E" and inside:
                    during.append(count)
                    inside = False
            elif tag == "M" and kind == "launch" and inside:
                count += 1
        for k, step in enumerate(o.get("steps") or []):
            last = [b for b in step.get("backwards") or [] if b[0] == m - 1]
            if not last or k >= len(during):
                continue
            _, start, end = last[-1]
            claimed = sum(1 for t, *_ in step.get("launches") or [] if start <= t <= end)
            if claimed > during[k]:
                problems.append(Problem(
                    f"step {k}: the record says stage {r % pp} launched {claimed} bucket{'s' if claimed != 1 else ''} "
                    f"during its last backward, but the journal the grader read as the run went shows "
                    f"{during[k]} launched before that backward ended: the launch times in the record were written "
                    f"after the fact, not when dp.launch was called", rank=r))
                break
    return problems


def _backwards(n: int) -> str:
    return f"{n} backward{'s' if n != 1 else ''}"


def judge_run(outcome) -> dict[str, list[Problem]]:
    # the record against what left each rank (rings: judge/wire.py), its launch times against the journal (placement)
    # an early launch is the cause of the gradients it left wrong: they are said under it, once each
    placement = journal_problems(outcome) or placement_problems(outcome)
    early = early_step(outcome) if any(p.gist == EARLY for p in placement) else None
    return {"values": value_problems(outcome, early), "plan": stage_plan_problems(outcome),
            "rings": ring_problems(outcome) + wire.byte_problems(outcome), "placement": placement}
