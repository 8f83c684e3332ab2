"""The answer's own `torch.distributed` collectives, recorded like the lab's (every topic's: q17's tensor-parallel
layers first, q19's ring when it calls one, any later all-to-all over an expert dimension).

An answer may call `dist.all_reduce` (and `all_gather`, `all_gather_into_tensor` or `all_gather_single`,
`reduce_scatter_tensor` or `reduce_scatter_single` (torch 2.13's names; the older ones call them),
`all_to_all`, `all_to_all_single`, `broadcast`, `reduce`, `barrier`) itself. A
barrier carries no data, but it is a round all the same: every rank waits for the slowest. Inside the
processes of a check or of the grader, `install()` replaces those entry points of `torch.distributed` and
`distributed_c10d` by wrappers that record each call as an `Event` of the event record (pipeline/trace.py):
its kind (`KINDS`: "all_reduce", "all_gather", ...: what it is, whichever dimension of a mesh its group spans;
the core declares them once, in `EVENTS` of comm/__init__.py), the global ranks of its group, and the bytes of
the tensor this rank handed to it. Judges count them per forward and backward; the timeline draws them.

While a q17 case runs, each recorded all-reduce also keeps what this rank handed it and what it gave back
(`CARRIED`): the record above can be stepped around (torch's own functions stay in the answer's reach), so the
judge also asks whether the part's result is made of that sum (judge_layers.made_of_the_sum).

A blocking call is made as an asynchronous one and waited for in a wait the check can stop
(pipeline/waiting.py), so a rank left alone in an all-reduce is reported, not hung. Calls made inside an
operation the lab traces itself (q14's `Grid.all_reduce`, a barrier) are not recorded twice, and nothing is
recorded outside a tracer (the worker's own bookkeeping, code run in a notebook's kernel).
"""
from __future__ import annotations

import contextlib
import inspect
import math
import sys
import threading

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from lab_src.harness.records import gave_up_waiting
from lab_src.pipeline import trace, waiting

# torch.distributed function -> the event kind it is recorded as
KINDS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
         "all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter",
         "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter": "reduce_scatter",
         "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
         "broadcast": "broadcast", "reduce": "reduce", "barrier": "dist_barrier"}
_ORIGINAL: dict = {}
# the global ranks of the case running now (set by its kind): a collective over other ranks too would wait
# for ranks that are not in the case, so it is refused at once, with the group to use
CASE_RANKS: list = []
# how a refusal names the group the answer should have used: (what it is, what the answer was given). A tensor-parallel
# kind says ("the tensor-parallel group", "tp.group"); other kinds leave the case's own words
CASE_GROUP: list = []
# while a q17 case runs (kind_layers arms it with a list): per recorded all-reduce, what this rank handed it and
# what it gave back, so that the judge can tell whether the part's output is made of the sum it recorded
CARRIED: list | None = None
# while a q25 case runs (its kind arms it with a list): per recorded all-to-all-single, how it split its rows (the event
# records the whole input's bytes, of which the rows a rank sends to itself never leave it)
ALL_TO_ALL: list | None = None


@contextlib.contextmanager
def bounded(ranks, what: str = "", given: str = ""):
    """While a case runs: the answer's collectives over other ranks than `ranks` are refused, naming the group as
    `what` ("the tensor-parallel group") and what the answer was given (`given`, "tp.group")."""
    CASE_RANKS[:] = ranks
    CASE_GROUP[:] = [what, given] if what else []
    try:
        yield
    finally:
        CASE_RANKS.clear()
        CASE_GROUP.clear()


class WrongGroup(ValueError):
    """A collective over ranks outside the case's own (the default group, the whole world)."""


class CollectiveGaveUp(RuntimeError):
    """A collective that timed out, or whose peer's connection closed under it. The group's state is undefined
    after it (some members may have gone through, some not, a message half-sent), so the case ends here: a part
    run after it would pair its collectives with the wrong ones of the others and read a deadlock, or wrong
    numbers, into a correct answer (the kinds re-raise it; harness/worker.py reports the timeout)."""


def _recording() -> bool:
    t = trace.active()
    return t is not None and t.pending is None


def _members(group) -> tuple:
    try:
        return tuple(dist.get_process_group_ranks(group if group is not None else dist.group.WORLD))
    except Exception:  # noqa: BLE001 - not a member: recorded without its ranks, the judge says so
        return ()


def _nbytes(name: str, bound: dict) -> tuple[tuple | None, int]:
    """The shape and bytes of what this rank hands to the collective: its input tensor (for an all-gather,
    its own piece; for a reduce-scatter, the whole buffer it scatters)."""
    if name in ("all_gather", "all_gather_into_tensor", "all_gather_single"):
        piece = bound.get("tensor", bound.get("input_tensor"))
    elif name in ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"):
        piece = bound.get("input", bound.get("input_list"))
    elif name in ("all_to_all", "all_to_all_single"):
        piece = bound.get("input", bound.get("input_tensor_list"))
    else:
        piece = bound.get("tensor")
    tensors = piece if isinstance(piece, (list, tuple)) else [piece]
    nbytes = sum(t.numel() * t.element_size() for t in tensors if hasattr(t, "numel"))
    first = tensors[0] if tensors else None
    return (tuple(first.shape) if hasattr(first, "shape") else None), nbytes


def _wrapper(name: str):
    original = _ORIGINAL[name]
    kind = KINDS[name]
    signature = inspect.signature(original)

    def wrapper(*args, **kwargs):
        if not _recording():
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)     # torch's own message for a malformed call
        shape, nbytes = _nbytes(name, bound)
        members = _members(bound.get("group"))
        if CASE_RANKS and not set(members) <= set(CASE_RANKS):
            where = (f"{CASE_GROUP[0]} is ranks {list(CASE_RANKS)}: pass group={CASE_GROUP[1]}" if CASE_GROUP else
                     f"the case's ranks are {list(CASE_RANKS)}: pass the process group your function was given as "
                     f"group=")
            raise WrongGroup(f"{name.replace('_', '-')} over ranks {list(members)}"
                             f"{' (the default group: no group= given)' if bound.get('group') is None else ''}, "
                             f"but {where}")
        keep = CARRIED is not None and name == "all_reduce" and hasattr(bound.get("tensor"), "detach")
        sent = bound["tensor"].detach().cpu().clone() if keep else None
        if ALL_TO_ALL is not None and name == "all_to_all_single":
            ALL_TO_ALL.append(split_record(bound, members))
        with trace.span(kind, None, None, shape, nbytes, group=members):
            bound_async = bool(bound.get("async_op"))
            try:
                work = original(**{**bound, "async_op": True})
                if work is not None:
                    waiting.wait(work)   # a wait the check can stop; an async_op caller's own wait() returns at once
                if keep:
                    CARRIED.append({"sent": sent, "got": bound["tensor"].detach().cpu().clone()})
            except RuntimeError as e:
                how = gave_up_waiting(str(e), type(e).__name__)
                if how not in ("timeout", "peer"):
                    raise               # a malformed call (a shape, a dtype): the answer's, an observation
                raise CollectiveGaveUp(
                    f"{name.replace('_', '-')} over ranks {list(members)} "
                    + ("timed out: a member did not come in time" if how == "timeout" else
                       "lost a member: its connection closed by peer (that rank timed out or died first)")) from None
        return work if bound_async else None
    wrapper.__name__, wrapper.__qualname__ = original.__name__, original.__qualname__
    wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original
    return wrapper


def split_record(bound: dict, members: tuple) -> dict:
    """An all-to-all-single's rows per peer, as it was called: {"in": rows sent to each member (in group order), "out":
    rows received from each, "row_bytes", "integer" (the tensor holds integers: counts, not tokens), "members"}."""
    x, out = bound.get("input"), bound.get("output")
    n = max(len(members), 1)

    def splits(given, t):
        if given is not None:
            return [int(v) for v in given]
        rows = t.shape[0] if hasattr(t, "shape") and t.dim() else 0
        return [rows // n] * n
    row_bytes = math.prod(x.shape[1:]) * x.element_size() if hasattr(x, "shape") and x.dim() else 0
    return {"in": splits(bound.get("input_split_sizes"), x), "out": splits(bound.get("output_split_sizes"), out),
            "row_bytes": int(row_bytes), "integer": bool(hasattr(x, "is_floating_point") and not x.is_floating_point()),
            "members": list(members)}


# the bytes the lab's own collectives (`lab`) sent from this rank since the case began, as gloo's algorithms send
# them (estimated: `wire_bytes`): the judge of the bytes on the wire (judge/wire.py) counts them apart from the
# answer's. Only calls made from the lab's own modules count; an answer calling `lab` gets no credit.
LAB_SENT = [0]
_LAB_LOCK = threading.Lock()


def _base(name: str) -> str:
    return name.replace("_into_tensor", "").replace("_single", "").replace("_tensor", "")


def wire_bytes(name: str, nbytes: list[int], size: int) -> int:
    """What one rank sends for collective `name` of tensors of `nbytes` bytes (as passed: output first where there is
    one) over a group of `size`, by ring algorithms: an all-reduce 2(n - 1)/n of the tensor, an all-gather (n - 1)
    inputs, a reduce-scatter (n - 1)/n of the input, an all-to-all (n - 1)/n of its input (even splits: the piece a
    rank keeps never leaves it), a broadcast at most the tensor; 0 for anything else."""
    if size <= 1 or not nbytes:
        return 0
    base = _base(name)
    if base == "all_reduce":
        return 2 * (size - 1) * nbytes[0] // size
    if base == "all_gather":
        return (size - 1) * nbytes[-1]
    if base in ("reduce_scatter", "all_to_all"):
        return (size - 1) * nbytes[-1] // size
    if base in ("broadcast", "reduce"):
        return nbytes[0]
    return 0


def wire_messages(name: str, size: int) -> int:
    """How many messages one rank sends for collective `name` over a group of `size` (each framed by gloo): a ring
    all-reduce 2(n - 1), any other n - 1 at most (a barrier's: small ones, counted the same)."""
    if size <= 1:
        return 0
    return 2 * (size - 1) if _base(name) == "all_reduce" else size - 1


def lab(name: str):
    """torch.distributed's own `name`, never recorded: the lab's bookkeeping (what a case reads of the shards, the
    replicas' agreement on a bucket), which is not the answer's traffic. Its bytes are counted in LAB_SENT when a
    module of the lab calls it."""
    original = _ORIGINAL.get(name) or getattr(dist, name)

    def counted(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("lab_src."):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            if not tensors and args and isinstance(args[0], list):      # all_gather(list, tensor)
                tensors = [a for a in args[1:] if isinstance(a, torch.Tensor)]
            group = kwargs.get("group")
            with _LAB_LOCK:
                LAB_SENT[0] += wire_bytes(name, [t.numel() * t.element_size() for t in tensors],
                                          dist.get_world_size(group))
        return original(*args, **kwargs)
    counted.__name__ = getattr(original, "__name__", name)
    return counted


def install() -> None:
    """Record raw collectives in this process from now on (idempotent)."""
    if _ORIGINAL:
        return
    for name in KINDS:
        _ORIGINAL[name] = getattr(c10d, name)
    for name in KINDS:
        fn = _wrapper(name)
        setattr(c10d, name, fn)
        setattr(dist, name, fn)


def installed() -> bool:
    return bool(_ORIGINAL)
