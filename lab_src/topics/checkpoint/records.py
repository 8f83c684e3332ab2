"""What q27's kind (kind.py) and judge (judge.py) share, torch-free: a case's settings, the shards of a flat vector
on n and on m ranks and where they overlap, the allowances the judge grants, the graded prediction, and the record
each rank fills.

The state a checkpoint holds (q21's, with the parameters): N elements of the flat parameters, cut in n shards as
torch.tensor_split cuts them (the first N % n one element longer); rank r of n holds shard r of the parameters and
AdamW's two moments of that shard (q21's `state["exp_avg"]`, `state["exp_avg_sq"]`), and the step count. Three
tensors of N elements in all: S = 3 N e bytes (e the element's bytes).
"""
from __future__ import annotations

from dataclasses import dataclass

from lab_src.harness.observed import Observed
from lab_src.harness.settings import Settings

TENSORS = ("params", "exp_avg", "exp_avg_sq")       # the three sharded tensors, in the order the lab names them
LR = 0.01

# Bytes a saving rank may write beyond its three shards: its metadata (global length, offset, length, dtype, the
# tensors' names, the step). A JSON file of it is about 150 B; a torch.save of a small dict about 1.5 KB (a zip).
META_BYTES_PER_RANK = 4096
# Bytes a loading rank may read beyond its slices, for each file of the folder: Python's buffered reader reads a
# whole block (4 KiB here, st_blksize) for a small read, numpy's fromfile about 2 KiB more than it keeps. Measured
# (tests/test_q27_load_sharded.py): a 40 B read through open() counts 4,096 B, a seek and a readinto of 80,000 B
# counts exactly 80,000 B.
READ_SLACK_PER_FILE = 8192
# the fences around the answer's calls, where the launching process reads the rank's I/O counters (kind.py, judge.py)
FENCES = {"save": ("save begins", "save ends"), "load": ("load begins", "load ends")}


def shard_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of shard i of a flat vector of `total` elements cut in n as torch.tensor_split does."""
    base, extra = divmod(total, n)
    start = i * base + min(i, extra)
    return start, start + base + (1 if i < extra else 0)


def chunk_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of piece i as torch.chunk cuts: ceil(total / n) each, the last shorter (or empty)."""
    size = -(-total // n)
    return min(total, i * size), min(total, (i + 1) * size)


def even_bounds(total: int, n: int, i: int) -> tuple[int, int]:
    """[start, end) of shard i where every shard is taken to be total // n long (the last taking the rest): the
    offsets a load guesses when the metadata does not say where each old shard begins."""
    size = total // n
    return i * size, (total if i == n - 1 else (i + 1) * size)


def overlaps(total: int, old: int, new: int, j: int) -> list[tuple[int, int, int]]:
    """The old shards that new rank j's shard overlaps: [(old rank i, start, end)] of the overlap, in order."""
    start, end = shard_bounds(total, new, j)
    out = []
    for i in range(old):
        a, b = shard_bounds(total, old, i)
        lo, hi = max(a, start), min(b, end)
        if lo < hi:
            out.append((i, lo, hi))
    return out


def state_bytes(total: int, element: int) -> int:
    """S: the three sharded tensors of N elements, once."""
    return len(TENSORS) * total * element


def slice_bytes(total: int, new: int, j: int, element: int) -> int:
    """What new rank j needs: its shard of each of the three tensors."""
    start, end = shard_bounds(total, new, j)
    return len(TENSORS) * (end - start) * element


def whole_files_bytes(total: int, old: int, new: int, j: int, element: int) -> int:
    """What new rank j reads when it reads every old shard it overlaps whole (its three tensors)."""
    return sum(len(TENSORS) * (shard_bounds(total, old, i)[1] - shard_bounds(total, old, i)[0]) * element
               for i, _, _ in overlaps(total, old, new, j))


@dataclass(frozen=True)
class CheckpointSettings(Settings):
    save: int = 4                   # n: the ranks that train and save
    load: int = 2                   # m: the ranks that load and go on
    steps: int = 2                  # q21's steps before the save
    lr: float = LR

    def __post_init__(self):
        if self.save < 1 or self.load < 1:
            raise ValueError(f"a q27 case saves on n >= 1 ranks and loads on m >= 1: n = {self.save}, m = {self.load}")

    def degrees(self, case) -> dict[str, int]:
        if case.stages != max(self.save, self.load):
            raise ValueError(f"a q27 case runs on max(n, m) = {max(self.save, self.load)} ranks, not {case.stages}")
        return {"dp": case.stages}


# the graded prediction: N = 1,000,000 float32 elements saved on 4 ranks, loaded on 3
PREDICTION_NAME = "predicted_reads"
PREDICTION_KEYS = ("bytes_rank1", "files_rank1", "whole_files_rank1")
PREDICTION_SHAPE = {"total": 1_000_000, "old": 4, "new": 3, "element": 4, "rank": 1}


def prediction_wanted() -> dict[str, float]:
    """New rank 1 of 3, after a save on 4: the bytes of its slices, how many old ranks' files it opens, and what it
    would read if it read those files whole."""
    p = PREDICTION_SHAPE
    return {"bytes_rank1": slice_bytes(p["total"], p["new"], p["rank"], p["element"]),
            "files_rank1": len(overlaps(p["total"], p["old"], p["new"], p["rank"])),
            "whole_files_rank1": whole_files_bytes(p["total"], p["old"], p["new"], p["rank"], p["element"])}


class CheckpointObserved(Observed):
    folder: str                 # the checkpoint's folder (absolute; rank 0 records it): the judge measures it itself
    elements: int               # N, the flat parameters' elements
    element_size: int           # bytes per element
    part: str                   # where the rank was when the answer raised ("save", "load", "continue", ...)
    saved: dict                 # a saving rank: what it held when save_sharded was called: {"step", "params" (its
                                #   shard of the flat parameters), "exp_avg", "exp_avg_sq"} (tensors cloned first)
    save_seconds: float
    written: int                # a saving rank: the bytes its process passed to write() during save_sharded
                                #   (/proc/self/io wchar)
    listing: dict               # rank 0 after every save: {relative path: size} of the folder, as the rank saw it
                                #   (the judge measures the folder itself; this is for a folder it cannot read)
    uninterrupted: dict         # a saving rank: the step after the save, in memory: {"loss", "params" (flat)}
    loaded: dict                # a loading rank: what load_sharded returned, plainly: {name: tensor or value},
                                #   "types": {name: type name}; or "returned": what it was when not a dict
    reads: int                  # a loading rank: bytes its process read() during load_sharded (rchar)
    read_calls: int             # ... and how many read calls (syscr)
    load_seconds: float
    handed: dict                # a loading rank: the step continued from the saved state handed over in memory by
                                #   the lab: {"loss", "params" (flat, after the step)}
    continued: dict             # a loading rank: the step continued from what load_sharded returned: {"loss",
                                #   "params"}, "params_from": "load" or "fresh" (no 'params' returned), "raised"
