"""Q18's experiment: what a wrong seed policy does to the learning curve.

    seed_policies()            # three runs of t = 2 with dropout, in one launch: a table and a figure

The digits model is trained on t = 2 ranks with dropout 0.1, three times, with the answer's block: once
with its own streams, then with the lab answering its `dropout.stream` calls by a wrong policy
(topics/tensor_parallel/kind_train.py, POLICIES): the masks inside the sharded region drawn from one stream shared by
the ranks, and the replicated region's stream (the LayerNorms' side) seeded per rank. Each run is set
against one process's curve (the same seed, batches and masks as pipeline/dropout.py defines them), and
the replicated LayerNorms are compared between the two ranks at the end. Not graded.
"""
from __future__ import annotations

from lab_src.topics.training.digits import DIGITS

STEPS, LR = 20, 1e-2
CONFIG = DIGITS.replace(num_stages=1, dropout=0.1, dropout_shards=2)


def seed_policies(steps: int = STEPS):
    """Run the three policies (one launch) and return the figure of their curves; None, launching nothing,
    while nbgrader validates or autogrades, or when q18's check ran in this kernel and failed."""
    import sys

    from lab_src.checks.common import errors, make_case, run_cases, run_dir, sources
    from lab_src.checks.experiments import skipped_under_validate
    from lab_src.grading import check_not_passed
    if skipped_under_validate("The seed-policy experiment", "open the notebook and run `seed_policies()`"):
        return None
    not_passed = check_not_passed("q18")
    if not_passed:
        print(f"The experiment trains with your block, and the check above did not pass: make it pass first.\n"
              f"  {not_passed.splitlines()[0]}", file=sys.stderr)
        return None
    from lab_src.topics.tensor_parallel.kind_train import POLICIES
    from lab_src.topics.tensor_parallel.judge_train import curve_deviation, single_process
    from lab_src.topics.tensor_parallel.curves import curves_figure
    srcs = sources("q18")
    cases = [make_case("tp_train", CONFIG, srcs, "q18", stages=2, label=policy,
                       settings={"t": 2, "steps": steps, "lr": LR, "seed_policy": policy}) for policy in POLICIES]
    run = run_cases(cases, run_dir("q18-seeds"))
    want = single_process(CONFIG, steps, LR)
    runs = []
    print(f"{'seed policy':<72}{'largest rel. diff':>18}{'LayerNorms apart':>18}")
    for out in run.outcomes:
        errs = errors(out, "q18", out.case.label)
        if errs:
            print(f"{POLICIES[out.case.label]:<72} did not finish: {errs[0]}")
            continue
        curves = {r: o["losses"] for r, o in sorted(out.obs.items()) if o.get("losses")}
        norms = [o.get("norms") or {} for _, o in sorted(out.obs.items())]
        apart = max((float((norms[0][n] - norms[1][n]).abs().max()) for n in norms[0] if n in norms[1]), default=0.0) \
            if len(norms) == 2 else float("nan")
        worst = max(curve_deviation(c, want) for c in curves.values())
        print(f"{POLICIES[out.case.label]:<72}{worst:>18.1e}{apart:>18.1e}")
        runs.append({"label": out.case.label, "single": want, "curves": curves})
    return curves_figure(runs, f"t = 2, dropout 0.1: three seed policies against one process ({steps} steps)")


__all__ = ["seed_policies"]
