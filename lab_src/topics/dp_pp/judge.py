"""Judge a run on a data-parallel x pipeline-parallel grid (q14), from what its ranks recorded.

The layout every answer must keep: global rank = dp_rank * pp_size + pp_rank, so pipeline d is the row of
ranks d*pp .. d*pp+pp-1, the data-parallel set of stage p the column p, p+pp, p+2pp, ..., and the tied
pair of pipeline d its first and last rank. `Layout` names these (records.py).

Problems are sorted in two parts, as the hidden tests score them:
- data parallel: coordinates, pipeline groups, the groups the data-parallel all-reduces ran over, the
  shards read, every replica's starting weights (those of the run seed), outputs, losses and gradients
  against the single-process baseline of the global batch, and each replica a real pipeline of the schedule;
- tied embeddings: the tied all-reduce over the first and last stage of each pipeline, the copies equal
  after a step, and their gradient the baseline's (judged only when the other gradients are right, so
  that a data-parallel mistake is not charged twice).
"""
from __future__ import annotations

from dataclasses import dataclass, replace


from lab_src.judge.failures import is_wait, rank_problems
from lab_src.judge.problems import Kind, Problem
from lab_src.judge.record import check_record
from lab_src.judge.realness import check_built_and_ran, check_layers, check_messages, check_order
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event
from lab_src.topics.dp_pp.judge_numbers import number_problems, tied_copy_problems, tied_grad_problems
from lab_src.topics.dp_pp.records import Layout, layout_of

@dataclass
class Verdict:
    data_parallel: list[Problem]
    tied: list[Problem]


def judge_grid(outcome, baseline: dict) -> Verdict:
    """Everything about one grid case: see the module's docstring."""
    case, obs = outcome.case, outcome.obs
    cfg, lay = case.config, layout_of(case)
    shards = shard_problems(obs, lay, cfg)
    dp_problems = group_problems(obs, lay) + layout_problems(obs, lay) + shards
    for r, o in sorted(obs.items()):
        if o.get("returned"):
            dp_problems.append(Problem(o["returned"], rank=r))
    tied = tied_group_problems(obs, lay, cfg)
    if any(o.get("grads") is None for o in obs.values()) or len(obs) < case.stages:
        if cfg.tie_embeddings and not tied:
            tied.append(Problem("the tied copies could not be checked: the step returned no stage on some rank"))
        return Verdict(dp_problems, tied)
    numbers = number_problems(obs, lay, cfg, baseline)
    if any(not p.consequence for p in shards):
        # a replica read the wrong samples: its outputs and gradients differ because of that, not on their own
        numbers = [replace(p, consequence=True) for p in numbers]
    if not dp_problems:
        dp_problems += replica_realness(outcome, lay)
    dp_problems += numbers
    tied += tied_copy_problems(obs, lay, cfg)
    if not numbers:       # the other gradients are right: the tied ones must be the baseline's too
        tied += tied_grad_problems(obs, lay, cfg, baseline)
    return Verdict(dp_problems, tied)


def failure_problems(outcome) -> list[Problem]:
    """A grid case that did not complete: first what its records say about the groups (a missing group is
    the usual cause of a collective that never completes), then the ranks' errors, those that raised
    something other than a timeout first (the cause; the timeouts of their partners are the consequence)."""
    case = outcome.case
    lay = layout_of(case)
    created = next((o.get("groups_created") for _, o in sorted(outcome.obs.items()) if o.get("groups_created")), None)
    hints = []
    if created is not None:
        lost = missing_groups(created, lay, tied=case.config.tie_embeddings)
        if lost:
            hints.append(Problem(f"{' and '.join(lost)} were never created (the groups created: {created}). "
                                 f"{stride_hint(lay)}"))
    if outcome.failure:
        return hints + [Problem(outcome.failure)]
    errors = outcome.errors()
    first = sorted(errors, key=lambda r: (is_wait(errors[r]), r))
    return hints + rank_problems({r: errors[r] for r in first[:1]}) + \
        [p for p in rank_problems(errors) if p.rank != first[0]]


# ---- groups and coordinates -------------------------------------------------------------------------
def collectives(o: dict, kind: str) -> list[Event]:
    return [e for e in map(Event.from_row, o.get("events", [])) if e.kind == kind]


def missing_groups(created: list[list[int]], lay: Layout, tied: bool) -> list[str]:
    """The groups of more than one rank that the layout needs and nobody created, described."""
    have = {tuple(sorted(g)) for g in created}
    out = []
    need = [("pipeline", [lay.pipeline(d) for d in range(lay.dp)], lay.pp > 1),
            ("data-parallel set", [lay.dp_set(p) for p in range(lay.pp)], lay.dp > 1),
            ("tied pair", [lay.tied_pair(d) for d in range(lay.dp)], tied and lay.pp > 1)]
    for what, groups, needed in need:
        lost = [g for g in groups if needed and tuple(g) not in have]
        if lost:
            out.append(f"the {what}{'s' if len(lost) > 1 else ''} {', '.join(map(str, lost))}")
    return out


def group_problems(obs: dict, lay: Layout) -> list[Problem]:
    """Which groups were created (the same on every rank) and which ones the data-parallel all-reduces used."""
    problems = []
    created = next((o.get("groups_created") for r, o in sorted(obs.items()) if o.get("groups_created")), None)
    if created is not None:
        lost = missing_groups(created, lay, tied=False)
        if lost:
            problems.append(Problem(f"{' and '.join(lost)} were never created (the groups created: {created}). "
                                    f"{stride_hint(lay)}"))
    for r, o in sorted(obs.items()):
        d, p = lay.coords(r)
        want = lay.dp_set(p)
        events = collectives(o, "allreduce_dp")
        if lay.dp > 1 and not events and not o.get("error"):
            problems.append(Problem(f"no data-parallel all-reduce was recorded on this rank (grid.all_reduce(..., "
                                    f"\"dp\") over its data-parallel set {want}): without one each replica keeps "
                                    f"the gradients of its own shard", rank=r))
        for e in events[:1] + [e for e in events[1:] if list(e.group) != list(events[0].group)][:1]:
            if list(e.group) != want:
                what = lay.name(list(e.group))
                problems.append(Problem(f"the data-parallel all-reduce ran over ranks {list(e.group)}"
                                        + (f", {what}" if what else "")
                                        + f"; the data-parallel set of stage {p} is ranks {want}. " + stride_hint(lay),
                                        rank=r))
    return problems


def stride_hint(lay: Layout) -> str:
    return (f"With rank = dp_rank * pp_size + pp_rank, a pipeline is {lay.pp} consecutive ranks and the ranks "
            f"holding one stage are pp_size = {lay.pp} apart.")


def layout_problems(obs: dict, lay: Layout) -> list[Problem]:
    problems = []
    for r, o in sorted(obs.items()):
        d, p = lay.coords(r)
        if "pp_rank" not in o:
            continue
        if o["pp_rank"] != p or o.get("pp_size") != lay.pp:
            problems.append(Problem(f"this rank built stage {o['pp_rank']} of {o.get('pp_size')}; with rank = "
                                    f"dp_rank * pp_size + pp_rank it is stage {p} of {lay.pp} in replica {d}", rank=r))
        if o.get("pipeline_group") != lay.pipeline(d):
            got = o.get("pipeline_group")
            what = lay.name(got or [])
            problems.append(Problem(f"its stage talks through the group of ranks {got}"
                                    + (f" ({what})" if what and not what.startswith("pipeline") else "")
                                    + f"; pipeline {d} is ranks {lay.pipeline(d)}. {stride_hint(lay)}", rank=r))
    return problems


def shard_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    """Each replica's first stage reads its own shard (dp_rank = its replica) in micro-batches of the
    replica's size; two replicas reading the same samples is the mistake of one data seed for all."""
    problems, read_by = [], {}
    mbs = cfg.global_batch_size // (lay.dp * cfg.num_microbatches)
    for r, o in sorted(obs.items()):
        d, _ = lay.coords(r)
        for dp_rank, _, batch in o.get("shards", []):
            shard = 0 if dp_rank is None else dp_rank
            read_by.setdefault(shard, []).append(d)
            if dp_rank is None and lay.dp > 1:
                problems.append(Problem(
                    f"this rank of replica {d} made its dataloader without dp_rank, so it reads the global batch "
                    f"from its first sample: the {cfg.num_microbatches} micro-batches of {batch} samples it takes "
                    f"are replica 0's shard, and every replica trains on replica 0's samples while the other shards "
                    f"are never read. Give each replica its own shard: make_dataloader(cfg, batch_size, "
                    f"dp_rank=dp_rank)", rank=r, kind=Kind.WHOLE_BATCH, gist="no dp_rank"))
            elif dp_rank is not None and dp_rank != d:
                problems.append(Problem(f"this rank of replica {d} reads shard {dp_rank}; each replica reads its "
                                        f"own shard: dp_rank={d}", rank=r))
            if batch != mbs:
                problems.append(Problem(f"this rank reads micro-batches of {batch} samples; a replica's micro-batch "
                                        f"is global_batch_size / (dp_size * num_microbatches) = "
                                        f"{cfg.global_batch_size} / ({lay.dp} * {cfg.num_microbatches}) = {mbs}",
                                        rank=r))
    shared = []
    for shard, replicas in sorted(read_by.items()):
        if len(set(replicas)) > 1:
            shared.append(Problem(f"replicas {sorted(set(replicas))} all read shard {shard}: identical samples on "
                                    f"every replica, as if their data had one seed. Data parallelism needs the "
                                    f"same weights but different data on each replica", gist="one shard for all"))
    whole = [p for p in problems if p.kind is Kind.WHOLE_BATCH]
    if whole:            # replicas share shard 0 because they read no shard at all: that follows from it
        shared = [replace(p, consequence=True) for p in shared]
    # the misconception first (no shard at all, or one shard for all), then where it showed
    return whole + shared + [p for p in problems if p not in whole]


def tied_group_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    problems = []
    for r, o in sorted(obs.items()):
        d, p = lay.coords(r)
        events = collectives(o, "allreduce_tied")
        holds_copy = cfg.tie_embeddings and lay.pp > 1 and p in (0, lay.pp - 1)
        want = lay.tied_pair(d)
        if holds_copy and not events and not o.get("error"):
            partner = want[1] if r == want[0] else want[0]
            problems.append(Problem(f"this rank never summed the tied embedding's gradient with its copy on rank "
                                    f"{partner} (no grid.all_reduce(..., \"tied\") over ranks {want} was recorded): "
                                    f"each copy keeps only its own use's gradient, and the copies drift apart", rank=r))
        for e in events[:1]:
            group = list(e.group)
            if not holds_copy and len(group) > 1:
                why = "the model's embeddings are not tied" if not cfg.tie_embeddings else \
                    "a middle stage holds no copy of the tied embedding" if 0 < p < lay.pp - 1 else \
                    "with one stage the embedding and the output projection are one parameter already"
                problems.append(Problem(f"this rank ran a tied all-reduce over ranks {group}, but {why}", rank=r))
            elif holds_copy and group != want:
                what = lay.name(group)
                problems.append(Problem(f"the tied all-reduce ran over ranks {group}" + (f", {what}" if what else "")
                                        + f"; the copies of pipeline {d}'s tied embedding are on its first and last "
                                          f"stage, ranks {want}", rank=r))
    return problems


# ---- numbers ----------------------------------------------------------------------------------------
def replica_realness(outcome, lay: Layout) -> list[Problem]:
    """Each row of the grid, seen as a pipeline of its own: layers, pieces built and run, its messages
    and the order of the case's schedule (judge/realness.py), problems named by global rank."""
    case, obs = outcome.case, outcome.obs
    m, sched = case.microbatches, schedule(case.schedule)
    events = [e for e in outcome.events() if not e.is_collective]
    problems = check_record(outcome)     # the order judged below is the one the run had (judge/record.py)
    for d in range(lay.dp):
        base = d * lay.pp
        found = check_layers({r - base: obs[r].get("layers", []) for r in lay.pipeline(d)},
                             case.config.num_layers)
        for r in lay.pipeline(d):
            found += check_built_and_ran(obs[r], r - base, lay.pp, m)
        mine = [replace(e, rank=e.rank - base) for e in events if e.rank in lay.pipeline(d)]
        shape = tuple(obs[base].get("activation_shape", ()))
        found += check_messages(mine, lay.pp, m, shape, sched)
        found += check_order(mine, lay.pp, m, sched)
        problems += [replace(p, rank=p.rank + base) if p.rank is not None else p for p in found]
    return problems
