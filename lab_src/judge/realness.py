"""Is the pipeline real? Matching numbers are not enough: a rank could run the whole model itself.

These checks read what each rank recorded about itself:
- layers: the stages together own every block once, in order (stage 0 the first blocks, and so on);
- built and ran: each rank built only its own pieces (embedding on the first stage, its blocks, the head
  on the last) and ran each of them forward once per micro-batch;
- messages: every send has a matching receive on the peer (same micro-batch and shape), activations go
  to the next stage and gradients to the previous one, once per micro-batch;
- record: each rank's returned compute order is the one the grader read live from its journal (judge/record.py);
- order: the rules of the case's schedule (pipeline/schedules.py), e.g. All-Forward-All-Backward runs
  every forward of a rank before its first backward.
"""
from __future__ import annotations

from collections import Counter

from lab_src.judge.problems import Kind, Problem, dedupe
from lab_src.judge.record import check_record
from lab_src.pipeline.schedules import Op, Schedule, matching_schedules, schedule
from lab_src.pipeline.trace import Event


def expected_pieces(layers: list[int], rank: int, p: int) -> list[str]:
    return (["embed"] if rank == 0 else []) + [f"blocks.{i}" for i in layers] + (["head"] if rank == p - 1 else [])


def check_layers(layers_by_rank: dict[int, list[int]], num_layers: int) -> list[Problem]:
    problems, seen = [], []
    for r in sorted(layers_by_rank):
        ids = layers_by_rank[r]
        if not ids:
            problems.append(Problem("this stage owns no block; every stage needs at least one", rank=r))
        if ids != sorted(ids) or (ids and ids != list(range(ids[0], ids[0] + len(ids)))):
            problems.append(Problem(f"blocks {ids} are not consecutive: a stage owns a contiguous run of "
                                      f"blocks, so activations only travel forward", rank=r))
        seen += ids
    counts = Counter(seen)
    twice = sorted(i for i, c in counts.items() if c > 1)
    lost = sorted(set(range(num_layers)) - set(seen))
    if twice:
        problems.append(Problem(f"blocks {twice} are owned by more than one stage"))
    if lost:
        problems.append(Problem(f"blocks {lost} are owned by no stage"))
    if not twice and not lost and seen != list(range(num_layers)):
        problems.append(Problem("the stages own the blocks out of order: stage 0 must hold the first "
                                  "blocks, the last stage the last ones"))
    return problems


def check_built_and_ran(obs: dict, rank: int, p: int, m: int) -> list[Problem]:
    want = expected_pieces(obs.get("layers", []), rank, p)
    built = obs.get("built", [])
    problems = []
    extra = [b for b in built if b not in want or built.count(b) > 1]
    if extra:
        problems.append(Problem(f"this rank built {_few(sorted(set(extra)))} besides its own pieces "
                                  f"{_few(want)}: a pipeline rank holds only its own layers", rank=rank))
    ran = obs.get("ran", {})
    foreign = sorted(k for k in ran if k not in want)
    if foreign:
        problems.append(Problem(f"this rank ran {_few(foreign)}, which belong to other stages", rank=rank))
    wrong = sorted(k for k in want if ran.get(k, 0) != m)
    if wrong and not foreign:
        k = wrong[0]
        problems.append(Problem(f"{k} ran forward {ran.get(k, 0)} times for {m} micro-batches", rank=rank))
    return problems


def check_messages(events: list[Event], p: int, m: int, shape: tuple, sched: Schedule | None = None,
                   counts: bool = True) -> list[Problem]:
    """Every send has its receive; each operation talks to the peer `Op.peer` names and carries the
    activation shape; each rank runs as many operations of each kind as the schedule's program (unless
    not `counts`: a communication case runs no compute, and its receives are judged on their own)."""
    sched = sched or schedule("afab")
    problems = []
    # a message is (sender, receiver, phase, micro-batch, shape); each needs a send and a receive
    sends = Counter((e.rank, e.peer, e.phase, e.microbatch, e.shape) for e in events if e.is_send)
    recvs = Counter((e.peer, e.rank, e.phase, e.microbatch, e.shape) for e in events if e.is_recv)
    for key in sorted(set(sends) | set(recvs), key=str):
        src, dst, phase, mb, shp = key
        if sends[key] != recvs[key]:
            send, recv = (Op.SEND_FORWARD, Op.RECV_FORWARD) if phase == "forward" else (Op.SEND_BACKWARD, Op.RECV_BACKWARD)
            if sends[key] > recvs[key]:
                problems.append(Problem(f"{send} to rank {dst} (shape {shp}) has no matching "
                                        f"{recv} on rank {dst}", rank=src, microbatch=mb))
            else:
                problems.append(Problem(f"{recv} from rank {src} (shape {shp}) has no matching "
                                        f"{send} on rank {src}", rank=dst, microbatch=mb))
    for e in events:
        op = e.op
        if op is None or op.is_compute:
            continue
        want = op.peer(e.rank, p, e.chunk, sched.chunks_per_rank)
        if e.peer != want:
            where = "next" if op.towards_next else "previous"
            problems.append(Problem(f"{e.label()}: this goes to/from the {where} stage, rank {want}",
                                    rank=e.rank, microbatch=e.microbatch))
        if e.shape != tuple(shape):
            problems.append(Problem(f"{e.label()} carries shape {e.shape}, not the activation shape {tuple(shape)}",
                                    rank=e.rank, microbatch=e.microbatch))
    for r in range(p):
        for op in Op:
            labels = Counter(e.microbatch for e in events if e.rank == r and e.kind == op.value)
            twice = sorted(mb for mb, n in labels.items() if n > 1 and mb is not None)
            if twice and set(labels) != set(range(m)):
                never = sorted(set(range(m)) - set(labels))
                problems.append(Problem(f"{op} is recorded for micro-batch {twice[0]} {labels[twice[0]]} times"
                                        + (f" and for micro-batch {never[0]} never" if never else "")
                                        + ": pass each operation the micro-batch it works on (microbatch=...)",
                                        rank=r, microbatch=twice[0]))
        if not counts:
            continue
        mine = Counter(e.kind for e in events if e.rank == r)
        want = sched.counts(r, p, m)
        problems += _split_counts(events, r, mine)
        mine, want = _fused(mine), _fused(want)
        for op in Op:
            n = want.get(op.value, 0)
            if mine.get(op.value, 0) != n:
                problems.append(Problem(f"{mine.get(op.value, 0)} {op} operations; a {p}-stage pipeline "
                                        f"with {m} micro-batches needs {n} on this rank", rank=r))
    return dedupe(problems)


def _fused(counts: Counter) -> Counter:
    """Counts with each split backward (I and W, zero bubble) counted as the one backward it splits: a run
    is judged on the order of its schedule (check_order), not on whether it splits its backwards."""
    out = Counter({Op.of(k) or k: n for k, n in counts.items()})
    out[Op.BACKWARD] += out.pop(Op.BACKWARD_INPUT, 0)
    out.pop(Op.BACKWARD_WEIGHT, None)
    return Counter({k.value if isinstance(k, Op) else k: n for k, n in out.items() if n})


def _split_counts(events, rank: int, mine: Counter) -> list[Problem]:
    """A split backward's W missing (or extra) for some micro-batch: the weights' gradients of that
    micro-batch never computed."""
    inputs = sorted(e.microbatch for e in events if e.rank == rank and e.kind == Op.BACKWARD_INPUT)
    weights = sorted(e.microbatch for e in events if e.rank == rank and e.kind == Op.BACKWARD_WEIGHT)
    never = sorted(set(inputs) - set(weights))
    if not never:
        return []
    return [Problem(f"backward_weight (W) never ran for micro-batch{'es' if len(never) > 1 else ''} "
                    f"{', '.join(map(str, never))} after its backward_input (I): those micro-batches add nothing "
                    f"to the weights' gradients. Every I needs its W before the step returns", rank=rank,
                    microbatch=never[0])]


def check_order(events: list[Event], p: int, m: int, sched: Schedule) -> list[Problem]:
    """The rules of `sched` (AFAB: no forward after a backward; 1F1B: at most min(p - r, m) micro-batches
    held per rank; ...). A run that breaks them but keeps another declared schedule's rules is told
    which one it is: a valid schedule, not the one this exercise asks for (a `Kind.WRONG_SCHEDULE`)."""
    broken = sched.violations(events, p, m)
    if not broken:
        return []
    kept = [s for s in matching_schedules(events, p, m) if s.name != sched.name]
    if kept:
        other = kept[0]
        r, mb, why = broken[0]
        return [Problem(f"{WRONG_SCHEDULE}: your step is a valid {other.title} schedule, but this exercise asks for "
                        f"{sched.title} ({why}). The numbers can match with either; what changes is the order "
                        f"of the operations and so the memory each rank holds."
                        + (f" {sched.summary}" if sched.summary else ""), rank=r, microbatch=mb, kind=Kind.WRONG_SCHEDULE)]
    return [Problem(why, rank=r, microbatch=mb) for r, mb, why in broken]


# The start of the message for a run that keeps another declared schedule's rules (see check_order; what
# decides its credit is its kind, Kind.WRONG_SCHEDULE).
WRONG_SCHEDULE = "another schedule"


def check_run(outcome) -> list[Problem]:
    """Is the pipeline case of `outcome` real: layers, pieces built and run, messages, and the order of
    the case's schedule."""
    case = outcome.case
    cfg, p, m = case.config, case.stages, case.microbatches
    sched = schedule(case.schedule)
    problems = check_record(outcome)     # the order judged below is the one the run had (judge/record.py)
    problems += check_layers({r: o.get("layers", []) for r, o in outcome.obs.items()}, cfg.num_layers)
    for r, o in sorted(outcome.obs.items()):
        problems += check_built_and_ran(o, r, p, m)
    shape = outcome.obs.get(0, {}).get("activation_shape", ())
    events = outcome.events()
    problems += check_messages(events, p, m, tuple(shape), sched)
    problems += check_order(events, p, m, sched)
    return problems


def _few(items, n: int = 4) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")
