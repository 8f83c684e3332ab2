"""A case's ranks as named dimensions, and every process group they need, made in one place.

    mesh = Mesh({"dp": 2, "pp": 2}, rank=ctx.rank, timeout_s=ctx.timeout_s)   # ranks 0..3 as a 2 x 2 grid
    mesh.coords()                 {"dp": 1, "pp": 0} for rank 2: global rank = dp_rank * pp + pp_rank
    mesh.members("pp")            [2, 3]: this rank's pipeline (the ranks that differ from it in pp only)
    mesh.neighbours("dp")         (previous, next) global ranks in this rank's ring along dp
    mesh.build("pp", "dp")        every group of pp (one per dp coordinate), then every group of dp, on every rank
    mesh.group("dp")              this rank's data-parallel process group (after build)
    mesh.add("tied", [[0, 1], [2, 3]])   named groups that are no dimension (a replica's first and last stage)
    mesh.destroy()                the groups it made (each holds threads of the collective library)

The ranks are laid out row-major in the order the dimensions are named, the last varying fastest, as picotron's
`torch.arange(world).view(dp, pp, cp, tp)` and torchtitan's `ParallelDims` do: the lab's grids are (dp, pp) (q14's
layout: pipeline d is ranks d*pp .. d*pp+pp-1) and (tp, pp) (q18's tensor parallel inside pipeline stages: stage s
is ranks s, s+pp, ...). Degrees are validated once: positive whole numbers whose product is the case's ranks.

Every rank of the case must make every group of the case, in the same order: torch names a process group by how
many groups its process has made (harness/worker.py keeps that count equal across a launch), so `build` and `add`
make all of a dimension's groups on every rank, in the order of the other coordinates. A dimension that spans all of
the case's ranks may reuse the case's own group (`whole=`) instead of making one. q14's `Grid` stays the student's
own: building these groups is that exercise's lesson.
"""
from __future__ import annotations

import itertools
import math

import torch.distributed as dist

from lab_src.harness import fence
from lab_src.harness.groups import timeout


def new_group(ranks, timeout_s: float):
    """A process group of these global ranks (collective: every rank of the launch's case calls it, in one order)."""
    return dist.new_group(list(ranks), timeout=timeout(timeout_s))


class Mesh:
    """Named dimensions over ranks 0..size-1; see the module's docstring."""

    def __init__(self, dims: dict[str, int], rank: int, timeout_s: float, whole=None):
        dims = dict(dims)
        bad = {k: v for k, v in dims.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if not dims or bad:
            raise ValueError(f"a mesh's degrees are whole numbers of at least 1: {dims}")
        self.dims, self.names = dims, tuple(dims)
        self.size = math.prod(dims.values())
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is not in a mesh of {self.size} ranks {dims}")
        self.rank, self.timeout_s, self.whole = rank, timeout_s, whole
        self._groups: dict[str, dict[tuple, object]] = {}      # name -> {ranks: process group}
        self._made: list = []                                   # the groups this mesh made (destroy)

    @classmethod
    def of(cls, case, ctx, whole=None) -> "Mesh":
        """The mesh of a case, from its kind's degrees (harness/settings.py `degrees_of`), for this rank."""
        from lab_src.harness.settings import degrees_of
        return cls(degrees_of(case), ctx.rank, ctx.timeout_s, whole=whole)

    def __repr__(self) -> str:
        return f"Mesh({', '.join(f'{k}={v}' for k, v in self.dims.items())}, rank={self.rank})"

    # -- arithmetic, no process group --
    def coords(self, rank: int | None = None) -> dict[str, int]:
        """The coordinates of a global rank (this one's by default)."""
        rank = self.rank if rank is None else rank
        out = {}
        for name in reversed(self.names):
            rank, out[name] = divmod(rank, self.dims[name])
        return {name: out[name] for name in self.names}

    def rank_at(self, **coords: int) -> int:
        """The global rank at these coordinates (each dimension named)."""
        rank = 0
        for name in self.names:
            rank = rank * self.dims[name] + coords[name]
        return rank

    def coord(self, dim: str) -> int:
        return self.coords()[dim]

    def all_members(self, dim: str) -> list[list[int]]:
        """Every group of `dim`: the global ranks that differ only in `dim`, one list per combination of the other
        coordinates, in row-major order of those; each list in order of `dim`'s coordinate."""
        others = [n for n in self.names if n != dim]
        out = []
        for values in itertools.product(*(range(self.dims[n]) for n in others)):
            fixed = dict(zip(others, values))
            out.append([self.rank_at(**fixed, **{dim: i}) for i in range(self.dims[dim])])
        return out

    def members(self, dim: str, rank: int | None = None) -> list[int]:
        """The group of `dim` a rank (this one by default) belongs to."""
        rank = self.rank if rank is None else rank
        return next(m for m in self.all_members(dim) if rank in m)

    def neighbours(self, dim: str) -> tuple[int, int]:
        """(previous, next) global ranks of this rank's ring along `dim`."""
        ring = self.members(dim)
        i = ring.index(self.rank)
        return ring[(i - 1) % len(ring)], ring[(i + 1) % len(ring)]

    # -- process groups: collective, every rank in the same order --
    def build(self, *dims: str) -> "Mesh":
        """Make every group of each dimension, in the order named (a dimension already built is skipped)."""
        for dim in dims:
            if dim not in self.dims:
                raise ValueError(f"{dim!r} is not a dimension of {self!r}")
            if dim not in self._groups:
                self.add(dim, self.all_members(dim))
        return self

    def add(self, name: str, groups: list[list[int]]) -> "Mesh":
        """Make named groups of given ranks (every rank makes every one, in this order)."""
        made = {}
        for ranks in groups:
            ranks = tuple(ranks)
            if self.whole is not None and ranks == tuple(range(self.size)):
                made[ranks] = self.whole            # the case's own group: not made, not destroyed
                continue
            made[ranks] = new_group(ranks, self.timeout_s)
            if self.rank in ranks:                  # another rank's group is a placeholder here
                self._made.append(made[ranks])
        self._groups[name] = made
        return self

    def entry(self, name: str) -> tuple | None:
        """(process group, its global ranks) of this rank's group `name`, or None where it belongs to none."""
        for ranks, group in self._groups[name].items():
            if self.rank in ranks:
                return group, list(ranks)
        return None

    def group(self, name: str):
        found = self.entry(name)
        return None if found is None else found[0]

    def destroy(self) -> None:
        """Destroy the groups this mesh made that this rank is in, once nothing is in flight on them. Their
        connections close with them: where the case's bytes are counted, they close once every rank's end of the
        case was read (harness/fence.py `after_end`), their counts with the rest."""
        made = list(self._made)
        self._made.clear()
        self._groups.clear()

        def close(made=made):
            for group in made:
                dist.destroy_process_group(group)
        if made and not fence.after_end(close):
            close()
