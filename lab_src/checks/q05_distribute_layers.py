"""Visible check of q05 (distribute_layers): each rank builds its stage from the answer; the stages together
own every block once, in order, balanced."""
from __future__ import annotations

from lab_src.checks.common import CheckReport, VISIBLE, errors, finish, make_case, run_cases, run_dir, sources
from lab_src.judge.problems import Problem, stamped
from lab_src.judge.realness import check_layers


def check() -> CheckReport:
    srcs = sources("q05")
    configs = [VISIBLE, VISIBLE.replace(num_stages=3, num_layers=7)]
    problems, lines = [], ["q05 distribute_layers"]
    run = run_cases([make_case("layout", cfg, srcs, "q05") for cfg in configs], run_dir("q05"))
    for cfg, out in zip(configs, run.outcomes):
        label = f"{cfg.num_layers} layers on {cfg.num_stages} stages"
        lines.append(f"\n  {label}:")
        problems += errors(out, "q05", label)
        layers = {r: o.get("layers", []) for r, o in sorted(out.obs.items())}
        for r, ids in layers.items():
            lines.append(f"    rank {r}: blocks {ids}" + ("  + embedding" if r == 0 else "")
                         + ("  + head" if r == cfg.num_stages - 1 else ""))
        if len(layers) == cfg.num_stages:
            problems += stamped(check_layers(layers, cfg.num_layers), "q05", label)
            sizes = [len(layers[r]) for r in range(cfg.num_stages)]
            if sizes != sorted(sizes, reverse=True) or max(sizes) - min(sizes) > 1:
                problems.append(Problem(f"stage sizes {sizes}: the stages should differ by at most one "
                                        f"block, the earlier stages taking the extra ones", exercise="q05", case=label))
    return finish("q05", run, problems, lines)
