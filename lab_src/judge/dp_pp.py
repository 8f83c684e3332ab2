"""Judge a run on a data-parallel x pipeline-parallel grid (q14), from what its ranks recorded.

The layout every answer must keep: global rank = dp_rank * pp_size + pp_rank, so pipeline d is the row of
ranks d*pp .. d*pp+pp-1, the data-parallel set of stage p the column p, p+pp, p+2pp, ..., and the tied
pair of pipeline d its first and last rank. `Layout` names these.

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

import torch

from lab_src.judge.compare import close, compare_loss, compare_outputs, explain_scale, scale_between
from lab_src.judge.failures import is_wait, rank_problems
from lab_src.judge.problems import Kind, Problem
from lab_src.judge.record import check_record
from lab_src.judge.realness import check_built_and_ran, check_layers, check_messages, check_order
from lab_src.pipeline.schedules import schedule
from lab_src.pipeline.trace import Event

TIED_NAMES = ("embed.tokens.weight", "head.proj.weight")


@dataclass(frozen=True)
class Layout:
    dp: int
    pp: int

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp_rank, pp_rank) of a global rank."""
        return divmod(rank, self.pp)

    def pipeline(self, d: int) -> list[int]:
        return [d * self.pp + p for p in range(self.pp)]

    def dp_set(self, p: int) -> list[int]:
        return [d * self.pp + p for d in range(self.dp)]

    def tied_pair(self, d: int) -> list[int]:
        return sorted({d * self.pp, d * self.pp + self.pp - 1})

    def name(self, ranks: list[int]) -> str:
        """What a group of these ranks is in this layout, if anything ('pipeline 1', ...)."""
        ranks = sorted(ranks)
        for d in range(self.dp):
            if ranks == self.pipeline(d) and len(ranks) > 1:
                return f"pipeline {d} (ranks holding different stages)"
        for p in range(self.pp):
            if ranks == self.dp_set(p) and len(ranks) > 1:
                return f"the data-parallel set of stage {p}"
        if ranks == list(range(self.dp * self.pp)):
            return "every rank"
        return ""


def layout_of(case) -> Layout:
    return Layout(case.config.dp_size, case.config.num_stages)


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
def shard_baseline(baseline: dict, lay: Layout, d: int) -> dict:
    """The baseline's output and loss for replica d's shard of the global batch."""
    out = baseline["output"]
    n = out.shape[0] // lay.dp
    part = out[d * n:(d + 1) * n]
    return {"output": part, "loss": float(part.double().mean())}


def weight_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    """Every replica's stage starts from the weights the run seed gives its pieces (a checksum each)."""
    from lab_src.pipeline.model import build_piece
    want: dict[str, float] = {}
    problems = []
    for r, o in sorted(obs.items()):
        got = o.get("weights") or {}
        for name, value in got.items():
            piece = name.split(".")[0] if not name.startswith("blocks.") else ".".join(name.split(".")[:2])
            if name not in want:
                built = build_piece(cfg, piece)
                want.update({f"{piece}.{n}": float(t.detach().double().sum()) for n, t in built.named_parameters()})
            if name in want and abs(value - want[name]) > 1e-4 * (1 + abs(want[name])):
                d, p = lay.coords(r)
                problems.append(Problem(f"replica {d}'s stage {p} starts from other weights than the run seed "
                                        f"gives ({name} differs): every replica must build its stage from the same "
                                        f"cfg (the same seed), so that the replicas hold the same model; only "
                                        f"their data differs", rank=r))
                break
    return problems


def number_problems(obs: dict, lay: Layout, cfg, baseline: dict) -> list[Problem]:
    problems = weight_problems(obs, lay, cfg)
    if problems:
        return problems
    m = cfg.num_microbatches
    shards = [shard_baseline(baseline, lay, d) for d in range(lay.dp)]
    for d in range(lay.dp):
        last = d * lay.pp + lay.pp - 1
        got = obs.get(last, {}).get("outputs")
        other = _matching_shard(got, shards, m) if got else None
        if other is not None and other != d:
            problems.append(Problem(f"replica {d}'s outputs are those of shard {other}: it read replica {other}'s "
                                    f"samples", rank=last))
            continue
        problems += compare_outputs(obs.get(last, {}), shards[d], m, last)
        problems += compare_loss(obs.get(last, {}), shards[d], m, last)
    for r, o in sorted(obs.items()):
        problems += grad_problems(o, lay, baseline, r)
        if lay.coords(r)[1] != lay.pp - 1 and (o.get("outputs") or o.get("loss") is not None):
            problems.append(Problem("a stage other than the last returned outputs or a loss; return what "
                                    "afab_step returned there ([], None)", rank=r))
    return problems


def _matching_shard(outputs, shards, m) -> int | None:
    for e, shard in enumerate(shards):
        chunks = shard["output"].chunk(m)
        if len(outputs) == len(chunks) and all(close(a, b) for a, b in zip(outputs, chunks)):
            return e
    return None


def grad_problems(o: dict, lay: Layout, baseline: dict, rank: int) -> list[Problem]:
    """Every gradient but the tied embedding's against the baseline, explained in data-parallel terms."""
    grads = o.get("grads") or {}
    base = baseline["grads"]
    missing = [n for n, g in grads.items() if g is None]
    if missing:
        return [Problem(f"{len(missing)} parameters have no gradient ({missing[0]}, ...)", rank=rank)]
    names = [n for n in grads if n not in TIED_NAMES]
    wrong = [n for n in names if not close(grads[n], base[n])]
    if not wrong:
        return []
    got = torch.cat([grads[n].reshape(-1).double() for n in wrong])
    want = torch.cat([base[n].reshape(-1).double() for n in wrong])
    return [Problem(f"{len(wrong)} of {len(names)} gradients differ from the baseline's over the global batch "
                    f"({', '.join(wrong[:2])}{' ...' if len(wrong) > 2 else ''}): "
                    + explain_dp_scale(scale_between(got, want), lay.dp, got, want), rank=rank)]


def explain_dp_scale(c: float | None, dp: int, got, want) -> str:
    if c is not None and dp > 1 and abs(c - dp) < 1e-3 * dp:
        return (f"they are {dp}x the baseline's, and {dp} is the data-parallel size: the all-reduce summed the "
                f"replicas' gradients; average them (divide by dp_size, or op=\"avg\")")
    if c is not None and dp > 1 and abs(c - 1 / dp) < 1e-3 / dp:
        return f"they are 1/{dp} of the baseline's: the gradients were divided by the data-parallel size twice"
    if c is not None and abs(c - 1) > 1e-3:
        return explain_scale(c, 1)
    return (f"largest difference {float((got - want).abs().max()):.3g}: each replica's gradient is its own "
            f"shard's until they are averaged over the data-parallel set")


def tied_grad_problems(obs: dict, lay: Layout, cfg, baseline: dict) -> list[Problem]:
    if not cfg.tie_embeddings:
        return []
    want = baseline["grads"]["embed.tokens.weight"]
    problems = []
    for d in range(lay.dp):
        first, last = lay.tied_pair(d)[0], lay.tied_pair(d)[-1]
        copies = {r: _tied_grad(obs.get(r, {})) for r in {first, last}}
        if any(g is None for g in copies.values()):
            problems.append(Problem("the tied embedding's copy has no gradient", rank=first))
            continue
        if all(close(g, want) for g in copies.values()):
            continue
        if first != last and close(copies[first] + copies[last], want):
            problems.append(Problem(f"ranks {first} and {last} each hold only their own use's gradient of the "
                                    f"tied embedding (the two add up to the baseline's): sum them over ranks "
                                    f"{[first, last]}", rank=first))
            continue
        for r, g in sorted(copies.items()):
            if not close(g, want):
                c = scale_between(g, want)
                how = explain_scale(c, 1) if c is not None else f"largest difference {float((g - want).abs().max()):.3g}"
                problems.append(Problem(f"the tied embedding's gradient differs from the baseline's: {how}", rank=r))
    return problems


def _tied_grad(o: dict):
    grads = o.get("grads") or {}
    for name in TIED_NAMES:
        if name in grads:
            return grads[name]
    return None


def tied_copy_problems(obs: dict, lay: Layout, cfg) -> list[Problem]:
    """After one SGD step the first and last stage's copies are equal. (That the replicas agree is the
    data-parallel part's business: their gradients and weights are judged there.)"""
    if not cfg.tie_embeddings:
        return []
    problems = []
    for d in range(lay.dp):
        pair = lay.tied_pair(d)
        copies = {r: obs.get(r, {}).get("tied_after_step") for r in pair}
        if any(c is None for c in copies.values()):
            problems.append(Problem("no copy of the tied embedding was found on this stage after the step",
                                    rank=next(r for r, c in copies.items() if c is None)))
            continue
        a, b = copies[pair[0]], copies[pair[-1]]
        if not close(a, b):
            problems.append(Problem(f"after one SGD step the two copies of the tied embedding differ (ranks "
                                    f"{pair[0]} and {pair[-1]}, largest difference "
                                    f"{float((a.double() - b.double()).abs().max()):.3g}): their gradients were "
                                    f"not the same, so the copies drift apart with every step", rank=pair[0]))
    return problems


# ---- each replica a real pipeline -------------------------------------------------------------------
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
