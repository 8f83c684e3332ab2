"""What the data-parallel kinds (kind.py) and judge (judge.py) share, torch-free, and the record each rank fills.

A ring case sums, one after another, tensors of several lengths over a group: the whole case (`columns`
absent) or the data-parallel columns of a grid of the case's ranks (`columns` = the grid's pipeline depth:
on 4 ranks with columns 2, the groups [0, 2] and [1, 3], where the ring's neighbours are positions in the
group and not global rank +- 1). The inputs are drawn from the case's seed (inputs.py), so the judge draws
the same ones without any of them travelling.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from lab_src.harness.observed import Observed, StageObserved
from lab_src.harness.settings import GridSettings, Settings


@dataclass(frozen=True)
class RingSettings(Settings):
    lengths: list                       # the tensors' lengths, summed one after another
    columns: int | None = None          # the rings are the data-parallel columns of a grid this many stages deep
    perturb: bool = False               # each rank changes its input by noise drawn from a seed outside the answer

    def degrees(self, case) -> dict[str, int]:
        columns = self.columns or 1
        return {"dp": case.stages // columns, "pp": columns}


@dataclass(frozen=True)
class StudySettings(Settings):
    lengths: list
    repeats: int = 5


@dataclass(frozen=True)
class NetworkSettings(Settings):
    layers: list                        # [[name, length]] in the order a backward finishes them
    steps: int
    network: dict                       # network.py `Network`'s fields


@dataclass(frozen=True)
class BucketsSettings(GridSettings):
    cap: int                            # the byte cap the Reducer is built with
    steps: int = 3                      # optimizer steps in a row
    mlp_caps: list = field(default_factory=list)    # the seed's MLP planned under these caps too
    freeze: list = field(default_factory=list)      # parameters left without a gradient

# the seed's MNIST MLP (784-256-128-64-10, float32): its four layers' gradients, weights and biases, are
# what a data-parallel step all-reduces (the bytes the seed lists: 803840, 131584, 33024 and 2600)
SEED_MLP = (784, 256, 128, 64, 10)
SEED_LAYERS = {f"fc{i + 1}": SEED_MLP[i] * SEED_MLP[i + 1] + SEED_MLP[i + 1] for i in range(len(SEED_MLP) - 1)}

PREDICTION_NAME = "predicted_bytes"     # a function of the answer cell: {"fc1": bytes, ...}
PREDICTION_KEYS = tuple(SEED_LAYERS)    # its keys, "fc1" to "fc4"
PREDICTION_RANKS = 4                    # the bytes each rank sends, on average, in a ring of 4 ranks

SAMPLED = 4096      # a large result travels as its digest, its float64 sum and this many elements drawn at random
WHOLE = 65_536      # up to this many elements, the result travels whole


def groups_of(ranks: int, columns: int | None) -> list[list[int]]:
    """The rings of a case: all its ranks, or the data-parallel columns of a grid `columns` stages deep."""
    if not columns:
        return [list(range(ranks))]
    return [list(range(c, ranks, columns)) for c in range(columns)]


def ring_bytes(length: int, n: int, element: int = 4) -> float:
    """What each rank of a ring over n ranks sends on average to all-reduce `length` elements: 2(n-1)/n of
    the tensor (every chunk is sent n-1 times in each half, whatever the chunks' sizes)."""
    return 2 * (n - 1) * length * element / n if n > 1 else 0.0


def chunk_cap(length: int, n: int) -> int:
    """The largest chunk of an even split of `length` elements into n: no message of a ring is larger."""
    return -(-length // n)


def chunk_of(index: int, length: int, n: int) -> int:
    """The chunk an element is in, for an even split into n (torch.tensor_split's)."""
    base, extra = divmod(length, n)
    edge = extra * (base + 1)
    return index // (base + 1) if index < edge else extra + (index - edge) // max(base, 1)


def step_of(index: int, n: int) -> str:
    """Which step of a ring of n a rank's `index`-th send (or receive) of a call is (from 0), in words."""
    return (f"the reduce-scatter's step {index + 1} of {n - 1}" if index < n - 1 else
            f"the all-gather's step {index - n + 2} of {n - 1}" if index < 2 * (n - 1) else
            f"its message {index + 1}, past the 2(n - 1) = {2 * (n - 1)} of a ring")


class RingObserved(Observed):
    group: list                 # the global ranks of this rank's ring, in the order of their positions
    position: int               # this rank's position in it
    summing: int                # the length it was summing last (the one it stopped in, if it raised)
    perturbed: int              # (rank 0, settings "perturb") the seed of the change the lab made to every input
    runs: list                  # per length summed: {"length", "dtype", "seconds", "returned" ("same": the
                                #   tensor handed in; "none"; "tensor": another; else a type's name),
                                #   "returned_digest" (another tensor's), "digest", "sum64", "whole" (the
                                #   tensor, short lengths) or "sample" ([indices], [values]), "sends" and
                                #   "recvs" ([[peer's global rank, bytes]]), "collectives" ([event kind]),
                                #   "carried" (per send, in the order posted: CARRIED_FIELDS), "unwaited"
                                #   ([["send" or "recv", peer's global rank, which of the call's sends or
                                #   receives it was]]: requests let go of before their wait())}


# what the message recorder keeps of each message a ring case sends (comm/messages.py CARRIED): enough to tell
# whether it held a partial sum of the ranks' inputs, without the message itself
CARRIED_FIELDS = ("peer", "elements", "first", "last", "sum64")


class StudyObserved(Observed):
    group: list
    timings: dict               # "ring" / "gloo" -> {length: [seconds of each repeat]}


class NetworkObserved(Observed):
    group: list
    steps: list                 # per step: [seconds of each layer's all-reduce, in the order summed] + [the step's]
    marks: list                 # per step: how many events the rank had recorded before it began
    sent: list                  # per message sent: [peer, number on the link, bytes, delay (s), slow, posted at
                                #   (perf_counter), [step, layer index]] (network.py `Links.sent`)


# q20: the seed's MLP planned under these caps (1 MiB: one bucket; 0.5 MiB: fc1's weight alone; 64 KiB: four)
MLP_CAPS = (1 << 20, 1 << 19, 1 << 16)
MLP_CAP_NAMES = {1 << 20: "1MiB", 1 << 19: "512KiB", 1 << 16: "64KiB"}
# a cap the seed's MLP's first bucket meets exactly (fc4's bias and weight, fc3's bias and weight: 40 + 2,560 + 256 +
# 32,768 B): the rule's plan keeps fc3.weight in it; a bucket closed when it would reach the cap is closed early
MLP_EXACT_CAP = 35_624
BUCKET_PREDICTION = "predicted_buckets"     # a function of q20's answer cell: the graded prediction
BUCKET_PREDICTION_KEYS = tuple(MLP_CAP_NAMES[cap] for cap in MLP_CAPS)    # its keys: how many buckets per cap
BUCKET_TOLERANCE = 0                        # a count of buckets: right only when exact


class BucketsObserved(StageObserved):
    grid: list                  # [dp, pp]
    params: list                # the stage's parameters in declaration order: [name, bytes, requires_grad]
    buckets: object             # the Reducer's `buckets` (lists of names), or its repr when it is not that
    mlp_plans: dict             # str(cap) -> the Reducer's buckets for the seed's MLP under that cap
    stepping: int               # the step the rank was in when it stopped (absent once every step ran)
    returned: str               # what was wrong with what the step returned, if anything
    shards: list                # the data shards read: [dp_rank, dp_size, batch size]
    steps: list                 # per optimizer step: {"span": [t0, t1], "loss", "launches": [[time, bytes, numel]],
                                #   "backwards": [[micro-batch, start, end]] (lane 0), "ring_sends": [[peer, bytes,
                                #   start]] (the reducing lane's), "collectives": [event kind], "tied_sums": [[time, bytes,
                                #   every bucket waited for]], "grads": {name: tensor}}
