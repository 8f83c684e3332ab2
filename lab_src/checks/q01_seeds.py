"""Q1's experiment (no graded code): what a seed does to the weights and data drawn on different ranks
(`lab_src.views.pictures.seeds_figure` draws it)."""
from __future__ import annotations

from lab_src.checks.common import (CheckReport, VISIBLE, autograding, autograding_report, errors, finish, make_case,
                                   run_cases, run_dir)


def demo_seeds(num_ranks: int = 4) -> CheckReport:
    """Q1's experiment: what a seed does to the weights drawn on different ranks."""
    if autograding():
        return autograding_report("q01")
    cfg = VISIBLE.replace(num_stages=num_ranks)
    lines = [f"{num_ranks} torchrun ranks, run seed {cfg.seed}. First numbers of each draw of weights, and the "
             f"first samples each rank would read:",
             f"{'':8}{'manual_seed(seed)':<28}{'manual_seed(seed + rank)':<30}{'block 3 (per-piece seed)':<30}"
             f"{'data: own shuffle':<20}{'data: slice of one'}"]
    run = run_cases([make_case("seeds", cfg, {}, "q01")], run_dir("q01"))
    out = run.outcomes[0]
    problems = errors(out, "q01", "seeds demo")
    for r, o in sorted(out.obs.items()):
        if "same_seed" in o:
            lines.append(f"rank {r}: {str(o['same_seed']):<28}{str(o['rank_seed']):<30}{str(o['block3']):<30}"
                         f"{str(o['data_same']):<20}{o['data_split']}")
    return finish("q01", run, problems, lines)
