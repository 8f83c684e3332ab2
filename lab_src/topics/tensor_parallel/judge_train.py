"""The judge of q18's training runs (the "tp_train" case kind, topics/tensor_parallel/kind_train.py).

The single-process run is computed here (topics/training/single_process.py: the whole model, the same seed,
batches and dropout, its attention masks drawn per shard of t as pipeline/dropout.py defines them), and
each rank that reports a loss (the last stage's) is compared with it step by step, within q13's tolerance
(topics/training/judge.py: CURVE_RTOL, 1e-5 relative in float32). A curve that leaves it is read for its cause:
ranks of one stage whose curves differ drew different masks outside the sharded region (seeded per
rank); ranks that agree with each other but not with one process drew the masks inside it wrong. The
replicated parameters (the LayerNorms) must end training equal on the ranks of a stage.
"""
from __future__ import annotations

import functools

import torch

from lab_src.harness.settings import settings_of
from lab_src.judge.problems import Problem
from lab_src.topics.tensor_parallel.records import ADAM_EPS
from lab_src.topics.training.records import CURVE_RTOL, relative_differences


@functools.lru_cache(maxsize=8)
def single_process(cfg, steps: int, lr: float, perturbed: int | None = None) -> list[float]:
    """One process's curve; `perturbed`: with the change a hidden case made to the embedding (the seed its
    rank 0 reported, pipeline/perturb.py)."""
    from lab_src.topics.training.digits import Digits
    from lab_src.topics.training.single_process import train_single_process
    return train_single_process(cfg, Digits(cfg, 1), steps, lr, perturbed=perturbed, eps=ADAM_EPS)["losses"]


def curve_deviation(got: list[float], want: list[float]) -> float:
    return max(relative_differences(got, want)) if got and len(got) == len(want) else float("inf")


def judge_training(outcome, steps: int, lr: float, want: list[float] | None = None,
                   unchanged: list[float] | None = None, block_right: bool = True) -> dict[str, list[Problem]]:
    """{"curves": [...], "replicated": [...]}: each reporting rank's curve, and the replicas' equality.
    `want`: one process's curve, if the caller has it (the grader keeps it on disk); else computed here. On a
    case that changed the embedding (settings "perturb"), `want` is the changed model's, and `unchanged` the
    configuration's own model's: a curve that follows the latter was not computed by the run. `block_right`:
    whether the block cases found the block right without dropout; where not, a curve that leaves one
    process's is their consequence, and the dropout streams are not named as its cause."""
    cfg, n = outcome.case.config, outcome.case.stages
    rtol = CURVE_RTOL[cfg.dtype]
    found = {"curves": [], "replicated": []}
    if settings_of(outcome.case).perturb:
        seed = (outcome.obs.get(0) or {}).get("perturbed")
        if not isinstance(seed, int):
            found["curves"].append(Problem(
                "rank 0's record of the run lacks the seed of the change the lab made to stage 0's embedding once "
                "it was built: the record was rewritten, and its losses cannot be told from a curve computed "
                "outside the run", rank=0))
            return found
        want = single_process(cfg, steps, lr, seed)
    want = want if want is not None else single_process(cfg, steps, lr)
    curves = {r: (outcome.obs.get(r) or {}).get("losses") for r in range(n)}
    reporting = {r: c for r, c in curves.items() if c}
    if not reporting:
        found["curves"].append(Problem("no rank reported a loss curve (see the errors above)"))
    t, p = (outcome.obs.get(0) or {}).get("grid") or [1, 1]
    for r, got in reporting.items():
        if len(got) != len(want):
            found["curves"].append(Problem(f"{len(got)} losses for {len(want)} steps", rank=r))
            continue
        diffs = relative_differences(got, want)
        if max(diffs) <= rtol:
            continue
        bad = next(i for i, d in enumerate(diffs) if d > rtol)
        if unchanged is not None and len(unchanged) == len(got) and max(relative_differences(got, unchanged)) <= rtol:
            found["curves"].append(Problem(
                f"the losses this rank reported are one process's training of the model as the configuration builds "
                f"it ({got[0]:.6g} at step 0), not of the model this run trained: the lab changed stage 0's embedding "
                f"once it was built, by an amount only the run knew, and a run of it starts at {want[0]:.6g}. The "
                f"curve was computed outside the run and written over the run's own: the loss is the last stage's "
                f"output, read as the run makes it", rank=r))
            continue
        peers = [c for q, c in reporting.items() if q != r and q % p == r % p and len(c) == len(got)]
        apart = any(max(relative_differences(got, c)) > rtol for c in peers)
        cause = (" The block without dropout is wrong already (above): the curve follows from it." if not block_right
                 else " The ranks of this stage disagree with each other: outside the sharded region they drew different "
                 "dropout masks (the shared stream seeded per rank), so the replicated LayerNorms and residual "
                 "stream drift apart." if apart else
                 " The ranks agree with each other but not with one process: the masks inside the sharded region "
                 "(each rank's heads) are not each shard's own stream's." if cfg.dropout else "")
        found["curves"].append(Problem(
            f"the loss curve leaves the single process's at step {bad}: {got[bad]:.6g} against {want[bad]:.6g} "
            f"(relative difference {diffs[bad]:.1e}, tolerance {rtol:.0e}; largest over the run "
            f"{max(diffs):.1e}).{cause}", rank=r, consequence=not block_right))
    by_stage: dict[int, list] = {}
    for r in range(n):
        norms = (outcome.obs.get(r) or {}).get("norms")
        if norms:
            by_stage.setdefault(r % p, []).append((r, norms))
    for stage, ranks in by_stage.items():
        (r0, first), rest = ranks[0], ranks[1:]
        for r, norms in rest:
            differ = [name for name, v in norms.items() if name in first and not torch.equal(v, first[name])]
            if differ:
                found["replicated"].append(Problem(
                    f"after training, the replicated {', '.join(differ[:3])}{' ...' if len(differ) > 3 else ''} "
                    f"differ between ranks {r0} and {r} of stage {stage}: replicated parameters stay identical "
                    f"only if every rank computes the same gradient for them", rank=r))
    return found
