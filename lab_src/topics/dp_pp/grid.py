"""`Grid`: what one rank of a data-parallel x pipeline-parallel run is given (exercise q14).

    grid.rank, grid.world_size        this process, and how many there are
    grid.dp_size, grid.pp_size        the shape of the grid: world_size == dp_size * pp_size
    grid.device                       where this rank computes
    grid.new_group(ranks)             a process group of these global ranks (every rank must create every
                                      group, in the same order), with the run's timeout
    grid.all_reduce(t, group, kind)   sum (or average, op="avg") `t` in place over `group`, recorded

Which rank is which stage of which replica, and which groups to build, is the student's part. The grid
only carries the operations out, checks what it is given, and records each all-reduce in the same event
record as the point-to-point messages (pipeline/trace.py): kind "allreduce_dp" or "allreduce_tied", the
group's global ranks, the bytes of the buffer. Before reducing, the members of the group compare what
each of them is about to reduce, so that a group of the wrong ranks (say, two stages that hold different
layers) is reported by name instead of crashing the collective library. Both collectives wait in a wait
the check can stop (pipeline/waiting.py): a rank left alone in one is reported at once, not at the timeout.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from lab_src.harness.groups import timeout
from lab_src.pipeline import trace, waiting

KINDS = {"dp": "allreduce_dp", "tied": "allreduce_tied"}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


class GroupMismatch(ValueError):
    """The members of a group are not reducing the same kind of tensor: a group of the wrong ranks."""


class Grid:
    def __init__(self, rank: int, world_size: int, dp_size: int, pp_size: int, device="cpu",
                 timeout_s: float = 30.0):
        if dp_size * pp_size != world_size:
            raise ValueError(f"a grid of {dp_size} x {pp_size} needs {dp_size * pp_size} ranks, not {world_size}")
        self.rank, self.world_size, self.dp_size, self.pp_size = rank, world_size, dp_size, pp_size
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.created: list[list[int]] = []        # the ranks of every group created, in order
        self._mine: list = []                     # the groups this rank is a member of

    def __repr__(self) -> str:
        return f"Grid(rank={self.rank}, world_size={self.world_size}, dp_size={self.dp_size}, pp_size={self.pp_size})"

    def new_group(self, ranks):
        """A process group of the global ranks `ranks`. Collective: every rank of the run calls it for
        every group, in the same order, members or not. Its operations give up after the run's timeout."""
        try:
            members = sorted({int(r) for r in ranks})
        except (TypeError, ValueError):
            raise TypeError(f"new_group takes a list of global ranks (ints), got {ranks!r}") from None
        bad = [r for r in members if not 0 <= r < self.world_size]
        if not members or bad:
            raise ValueError(f"new_group({list(ranks)!r}): the ranks are 0..{self.world_size - 1}")
        self.created.append(members)
        group = dist.new_group(members, timeout=timeout(self.timeout_s))
        if self.rank in members:
            self._mine.append(group)
        return group

    def close(self) -> None:
        """Destroy this rank's groups (each holds a few threads of the collective library): the harness
        calls it after a step that completed, when nothing is in flight on them."""
        while self._mine:
            try:
                dist.destroy_process_group(self._mine.pop())
            except Exception:  # noqa: BLE001 - a group already gone is fine
                pass

    def all_reduce(self, tensor, group, kind: str, op: str = "sum") -> None:
        """Reduce `tensor` in place over the ranks of `group`: their sum (op="sum") or average (op="avg").
        `kind` says what it is for: "dp" (a data-parallel gradient reduction) or "tied" (the tied
        embedding's gradient). Every member must call it with a tensor of the same size and dtype."""
        if kind not in KINDS:
            raise ValueError(f"all_reduce kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
        if op not in OPS:
            raise ValueError(f"all_reduce op must be one of {', '.join(map(repr, OPS))}, got {op!r}")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"all_reduce needs a tensor, got {type(tensor).__name__} "
                            f"(a parameter without a gradient has .grad None: did its backward run?)")
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            raise ValueError(f"rank {self.rank} reduces over a group it is not a member of (for a rank outside its "
                             f"`ranks`, new_group returns a placeholder): of the groups every rank created, use one "
                             f"whose ranks include {self.rank}")
        if isinstance(group, (list, tuple)) or not hasattr(group, "size"):
            raise TypeError("all_reduce needs a process group (what grid.new_group returned), not a list of ranks")
        members = dist.get_process_group_ranks(group)
        if self.rank not in members:
            raise ValueError(f"rank {self.rank} reduces over a group of ranks {members} it is not a member of")
        with trace.waiting(KINDS[kind], tuple(members)):
            self._agree(tensor, group, members, kind)
        nbytes = tensor.numel() * tensor.element_size()
        with trace.span(KINDS[kind], None, None, tuple(tensor.shape), nbytes, group=tuple(members)):
            if len(members) > 1:
                waiting.wait(dist.all_reduce(tensor, op=OPS[op], group=group, async_op=True))

    def _agree(self, tensor, group, members: list[int], kind: str) -> None:
        """Every member learns what the others reduce; any difference raises on every member alike."""
        if len(members) == 1:
            return
        dtype = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
        mine = torch.tensor([tensor.numel(), dtype, list(KINDS).index(kind)], dtype=torch.int64, device=tensor.device)
        seen = [torch.empty_like(mine) for _ in members]
        waiting.wait(dist.all_gather(seen, mine, group=group, async_op=True))
        said = {r: tuple(int(x) for x in s.tolist()) for r, s in zip(members, seen)}
        if len(set(said.values())) > 1:
            what = "; ".join(f"rank {r}: {n} elements ({list(KINDS)[k]})" for r, (n, _, k) in said.items())
            raise GroupMismatch(
                f"the all-reduce over ranks {members} got different tensors from its members ({what}). "
                f"The members of a group must reduce the same tensors in the same order: are these the "
                f"ranks you meant? Ranks that hold different layers (two stages of one pipeline) have "
                f"nothing to reduce together.")
