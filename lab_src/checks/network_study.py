"""q19's network study, run from the notebook: the answer's ring all-reduces the seed's four layers' gradients,
last layer first, step after step over an emulated network with a latency tail (the case kind "ring_network",
topics/data_parallel/kind_network.py), read into a NetworkStudy (topics/data_parallel/tail.py: the table, the
distributions, the slowest step's timeline).

    from lab_src.checks.network_study import network_study
    study = network_study(predicted={"p50": ..., "p99": ...})    # your prediction of a step, in ms
"""
from __future__ import annotations

from lab_src.harness.memory_release import released
from lab_src.topics.data_parallel.network import Network
from lab_src.topics.data_parallel.records import SEED_LAYERS
from lab_src.topics.data_parallel.tail import NetworkStudy, study_of

NETWORK = Network(latency=1e-3, bandwidth=125e6, tail_share=0.002, tail_factor=100.0, seed=19)
BACKWARD_ORDER = [[name, SEED_LAYERS[name]] for name in reversed(SEED_LAYERS)]     # fc4 first, as a backward ends


@released
def network_study(n: int = 4, steps: int = 200, predicted: dict | None = None,
                  network: Network = NETWORK) -> NetworkStudy | None:
    """Run `steps` data-parallel steps' all-reduces on `n` ranks over `network` (emulated) and print the table,
    with `predicted` ({"p50": ms, "p99": ms}, a step's) beside the measurement; None (after one line that says
    why) under nbgrader's Validate and while autograding (it is not graded), or when the run fails."""
    from lab_src.checks.common import make_case, run_cases, run_dir, sources
    from lab_src.checks.experiments import skipped_under_validate
    from lab_src.judge.failures import case_problems
    from lab_src.pipeline.config import LabConfig
    if skipped_under_validate("The network study", "open the notebook and run `study = network_study(...)`"):
        return None
    case = make_case("ring_network", LabConfig(num_stages=n, seed=9), sources("q19"), "q19", stages=n,
                     label=f"network study, {n} ranks, {steps} steps",
                     settings={"layers": BACKWARD_ORDER, "steps": steps, "network": network.settings()})
    # about 0.15 s a step on 4 ranks of 2 cores (the slow steps included): the case may take that long
    out = run_cases([case], run_dir("q19-network"), case_deadline_s=60 + steps * 0.5).outcomes[0]
    problems = case_problems(out)
    if problems:
        print(f"The network study did not finish ({problems[0].message.splitlines()[0]}): run check(\"q19\"), "
              f"which says why, and come back when it passes.")
        return None
    study = study_of(out, n, network, BACKWARD_ORDER)
    study.table(predicted)
    return study


__all__ = ["network_study"]
