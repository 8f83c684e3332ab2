"""The reference pipeline in real torchrun processes (gloo on the CPU) against the unsharded baseline."""
from __future__ import annotations

import threading

import pytest

from lab_src.harness.baselines import baselines_for
from lab_src.judge.compare import compare_run
from lab_src.pipeline.config import LabConfig
from lab_src.judge.realness import check_run
from lab_src.harness.case import Case
from lab_src.harness.runner import run_cases

TWO_RANKS = [LabConfig(num_stages=1, num_layers=3, num_microbatches=2, global_batch_size=4),
             LabConfig(num_stages=2, num_layers=4, num_microbatches=1, global_batch_size=4),
             LabConfig(num_stages=2, num_layers=5, num_microbatches=3, global_batch_size=6, dtype="float64")]
FOUR_RANKS = [LabConfig(num_stages=4, num_layers=8, num_microbatches=6, global_batch_size=12),
              LabConfig(num_stages=3, num_layers=7, num_microbatches=2, global_batch_size=4, seed=7),
              LabConfig(num_stages=4, num_layers=10, num_microbatches=4, global_batch_size=8, seed=5, dtype="float64"),
              LabConfig(num_stages=4, num_layers=4, num_microbatches=1, global_batch_size=2)]


def pipeline_cases(configs, answers):
    """The cases of `configs` in one launch, and their baselines, computed where that launch computes."""
    from lab_src.harness.groups import device_for
    baselines = baselines_for(configs, answers, device=device_for(max(c.num_stages for c in configs)))
    return [Case(kind="pipeline", qid="q08", config=cfg, answers=answers) for cfg in configs], baselines


@pytest.mark.parametrize("configs", [TWO_RANKS, FOUR_RANKS], ids=["2 ranks", "4 ranks"])
def test_reference_pipeline_matches_the_baseline(configs, reference, tmp_path, no_leftovers):
    cases, baselines = pipeline_cases(configs, reference)
    run = run_cases(cases, tmp_path / "run")
    assert len(run.launches) == 1, "all cases share one launch"
    assert run.launches[0].leftovers == 0
    for cfg, outcome in zip(configs, run.outcomes):
        assert outcome.failure is None and not outcome.errors(), (cfg, outcome.failure, outcome.errors())
        problems = compare_run(outcome, baselines[cfg]) + check_run(outcome)
        assert problems == [], (cfg.describe(), [str(p) for p in problems])
        # each rank built only its own pieces, and the messages are the schedule's
        for r, o in outcome.obs.items():
            assert "embed" in o["built"] if r == 0 else "embed" not in o["built"]
            assert ("head" in o["built"]) == (r == cfg.num_stages - 1)
        p, m = cfg.num_stages, cfg.num_microbatches
        sends = [e for e in outcome.events() if e.kind.startswith("send")]
        assert len(sends) == 2 * (p - 1) * m
        assert {e.shape for e in sends} <= {(cfg.global_batch_size // m, cfg.seq_len, cfg.hidden_size)}


def test_uneven_layers_go_to_the_earlier_stages(reference, tmp_path):
    cfg = FOUR_RANKS[1]
    run = run_cases([Case(kind="layout", qid="q05", config=cfg, answers=reference, stages=3)], tmp_path)
    assert [run.outcomes[0].obs[r]["layers"] for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]


def test_two_launches_at_once_both_succeed(reference, tmp_path, no_leftovers):
    results = {}

    def go(name, cfg):
        cases, _ = pipeline_cases([cfg], reference)
        results[name] = run_cases(cases, tmp_path / name / "run")

    threads = [threading.Thread(target=go, args=(n, c)) for n, c in (("a", FOUR_RANKS[0]), ("b", TWO_RANKS[1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for name in "ab":
        outcome = results[name].outcomes[0]
        assert outcome.failure is None and not outcome.errors(), (name, outcome.failure, outcome.errors())


@pytest.mark.gpu
def test_reference_pipeline_on_gpus_with_nccl(reference, tmp_path, no_leftovers):
    """With one GPU per rank the checks use NCCL and CUDA; the baseline runs on a GPU too."""
    import torch

    from lab_src.harness.groups import device_for
    n = min(4, torch.cuda.device_count())
    configs = [LabConfig(num_stages=n, num_layers=2 * n, num_microbatches=4, global_batch_size=8),
               LabConfig(num_stages=2, num_layers=5, num_microbatches=3, global_batch_size=6, dtype="float64")]
    assert device_for(n) == "cuda"
    cases, baselines = pipeline_cases(configs, reference)
    run = run_cases(cases, tmp_path / "run")
    for cfg, outcome in zip(configs, run.outcomes):
        assert outcome.failure is None and not outcome.errors(), (outcome.failure, outcome.errors())
        assert compare_run(outcome, baselines[cfg]) + check_run(outcome) == []
