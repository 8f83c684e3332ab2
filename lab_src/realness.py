"""Is the pipeline real? Matching numbers are not enough: a rank could run the whole model itself.

These checks read what each rank recorded about itself:
- layers: the stages together own every block once, in order (stage 0 the first blocks, and so on);
- built and ran: each rank built only its own pieces (embedding on the first stage, its blocks, the head
  on the last) and ran each of them forward once per micro-batch;
- messages: every send has a matching receive on the peer (same micro-batch and shape), activations go
  to the next stage and gradients to the previous one, once per micro-batch;
- order: All-Forward-All-Backward means every forward of a rank ends before its first backward.
"""
from __future__ import annotations

from collections import Counter

from .problems import Problem
from .trace import COMPUTE, Event


def expected_pieces(layers: list[int], rank: int, p: int) -> list[str]:
    return (["embed"] if rank == 0 else []) + [f"blocks.{i}" for i in layers] + (["head"] if rank == p - 1 else [])


def check_layers(layers_by_rank: dict[int, list[int]], num_layers: int, blame: str, case: str) -> list[Problem]:
    problems, seen = [], []
    for r in sorted(layers_by_rank):
        ids = layers_by_rank[r]
        if not ids:
            problems.append(Problem(blame, "this stage owns no block; every stage needs at least one", r, None, case))
        if ids != sorted(ids) or (ids and ids != list(range(ids[0], ids[0] + len(ids)))):
            problems.append(Problem(blame, f"blocks {ids} are not consecutive: a stage owns a contiguous run of "
                                           f"blocks, so activations only travel forward", r, None, case))
        seen += ids
    counts = Counter(seen)
    twice = sorted(i for i, c in counts.items() if c > 1)
    lost = sorted(set(range(num_layers)) - set(seen))
    if twice:
        problems.append(Problem(blame, f"blocks {twice} are owned by more than one stage", None, None, case))
    if lost:
        problems.append(Problem(blame, f"blocks {lost} are owned by no stage", None, None, case))
    if not twice and not lost and seen != list(range(num_layers)):
        problems.append(Problem(blame, "the stages own the blocks out of order: stage 0 must hold the first "
                                       "blocks, the last stage the last ones", None, None, case))
    return problems


def check_built_and_ran(obs: dict, rank: int, p: int, m: int, blame: str, case: str) -> list[Problem]:
    want = expected_pieces(obs.get("layers", []), rank, p)
    built = obs.get("built", [])
    problems = []
    extra = [b for b in built if b not in want or built.count(b) > 1]
    if extra:
        problems.append(Problem(blame, f"this rank built {_few(sorted(set(extra)))} besides its own pieces "
                                       f"{_few(want)}: a pipeline rank holds only its own layers", rank, None, case))
    ran = obs.get("ran", {})
    foreign = sorted(k for k in ran if k not in want)
    if foreign:
        problems.append(Problem(blame, f"this rank ran {_few(foreign)}, which belong to other stages", rank, None, case))
    wrong = sorted(k for k in want if ran.get(k, 0) != m)
    if wrong and not foreign:
        k = wrong[0]
        problems.append(Problem(blame, f"{k} ran forward {ran.get(k, 0)} times for {m} micro-batches", rank, None, case))
    return problems


def check_messages(events: list[Event], p: int, m: int, shape: tuple, blame: str, case: str) -> list[Problem]:
    problems = []
    # a message is (sender, receiver, phase, micro-batch, shape); each needs a send and a receive
    sends = Counter((e.rank, e.peer, e.kind.split("_")[1], e.microbatch, e.shape)
                    for e in events if e.kind.startswith("send"))
    recvs = Counter((e.peer, e.rank, e.kind.split("_")[1], e.microbatch, e.shape)
                    for e in events if e.kind.startswith("recv"))
    for key in sorted(set(sends) | set(recvs), key=str):
        src, dst, phase, mb, shp = key
        if sends[key] != recvs[key]:
            if sends[key] > recvs[key]:
                problems.append(Problem(blame, f"send_{phase} to rank {dst} (shape {shp}) has no matching "
                                               f"recv_{phase} on rank {dst}", src, mb, case))
            else:
                problems.append(Problem(blame, f"recv_{phase} from rank {src} (shape {shp}) has no matching "
                                               f"send_{phase} on rank {src}", dst, mb, case))
    for e in events:
        if e.kind in ("send_forward", "recv_backward") and e.peer != e.rank + 1:
            problems.append(Problem(blame, f"{e.label()}: this goes to/from the next stage, rank {e.rank + 1}",
                                    e.rank, e.microbatch, case))
        if e.kind in ("send_backward", "recv_forward") and e.peer != e.rank - 1:
            problems.append(Problem(blame, f"{e.label()}: this goes to/from the previous stage, rank {e.rank - 1}",
                                    e.rank, e.microbatch, case))
        if not e.is_compute and e.shape != tuple(shape):
            problems.append(Problem(blame, f"{e.label()} carries shape {e.shape}, not the activation shape {tuple(shape)}",
                                    e.rank, e.microbatch, case))
    for r in range(p):
        mine = Counter(e.kind for e in events if e.rank == r)
        want = {"forward": m, "backward": m,
                "recv_forward": m if r > 0 else 0, "send_backward": m if r > 0 else 0,
                "send_forward": m if r < p - 1 else 0, "recv_backward": m if r < p - 1 else 0}
        for kind, n in want.items():
            if mine.get(kind, 0) != n:
                problems.append(Problem(blame, f"{mine.get(kind, 0)} {kind} operations; a {p}-stage pipeline "
                                               f"with {m} micro-batches needs {n} on this rank", r, None, case))
    return _dedupe(problems)


def check_afab_order(events: list[Event], p: int, blame: str, case: str) -> list[Problem]:
    problems = []
    for r in range(p):
        compute = sorted((e for e in events if e.rank == r and e.kind in COMPUTE), key=lambda e: e.t_start)
        first_b = next((i for i, e in enumerate(compute) if e.kind == "backward"), None)
        late_f = [e for e in compute[first_b:] if e.kind == "forward"] if first_b is not None else []
        if late_f:
            mb = late_f[0].microbatch
            problems.append(Problem(blame, f"forward of micro-batch {mb} runs after a backward: "
                                           f"All-Forward-All-Backward runs every forward first", r, mb, case))
    return problems


def check_run(outcome, blame: str, case: str = "") -> list[Problem]:
    cfg = outcome.case["config"]
    p, m = outcome.case["stages"], cfg["num_microbatches"]
    problems = check_layers({r: o.get("layers", []) for r, o in outcome.obs.items()}, cfg["num_layers"], blame, case)
    for r, o in sorted(outcome.obs.items()):
        problems += check_built_and_ran(o, r, p, m, blame, case)
    shape = outcome.obs.get(0, {}).get("activation_shape", ())
    events = outcome.events()
    problems += check_messages(events, p, m, tuple(shape), blame, case)
    problems += check_afab_order(events, p, blame, case)
    return problems


def _few(items, n: int = 4) -> str:
    items = list(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen, out = set(), []
    for p in problems:
        if str(p) not in seen:
            seen.add(str(p))
            out.append(p)
    return out
