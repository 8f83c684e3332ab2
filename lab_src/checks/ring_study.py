"""q19's study, run from the notebook: the answer's ring and gloo's all-reduce timed on n ranks of this machine
(the case kind "ring_study", topics/data_parallel/kind_study.py), read into a RingStudy
(topics/data_parallel/study.py: the table, the alpha-beta fit, the figure).

    from lab_src.checks.ring_study import ring_study
    study = ring_study()
"""
from __future__ import annotations

from lab_src.harness.memory_release import released
from lab_src.topics.data_parallel.study import LENGTHS, RingStudy, study_of


@released
def ring_study(n: int = 4, lengths=LENGTHS, repeats: int = 5) -> RingStudy | None:
    """Time the answer's ring and gloo's all-reduce on `n` ranks at `lengths` (float32), `repeats` times each,
    and print the table; None (after one line that says why) when it does not run: under nbgrader's Validate
    and while autograding (it is not graded), or when a run fails (the check says why)."""
    from lab_src.checks.common import make_case, run_cases, run_dir, sources
    from lab_src.checks.experiments import skipped_under_validate
    from lab_src.judge.failures import case_problems
    from lab_src.pipeline.config import LabConfig
    if skipped_under_validate("The ring study", "open the notebook and run `study = ring_study()`"):
        return None
    case = make_case("ring_study", LabConfig(num_stages=n, seed=9), sources("q19"), "q19", stages=n,
                     label=f"ring study, {n} ranks", settings={"lengths": list(lengths), "repeats": repeats})
    out = run_cases([case], run_dir("q19-study")).outcomes[0]
    problems = case_problems(out)
    if problems:
        print(f"The ring study did not finish ({problems[0].message.splitlines()[0]}): run check(\"q19\"), which "
              f"says why, and come back when it passes.")
        return None
    study = study_of(out, n)
    study.table()
    return study


__all__ = ["ring_study"]
