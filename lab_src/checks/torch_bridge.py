"""The bridge to the production API (q12): your 1F1B step and torch.distributed.pipelining's Schedule1F1B
on the same stages (the DEMO model, where compute dominates), drawn one above the other, with each rank's
order beside the order torch's schedule ran (recorded from its calls to its stage).

    bridge = torch_bridge(bubbles)      # reuses your m = 8 run of the bubble study, if there is one
    bridge.figure()

Ungraded; launches nothing under Validate or while autograding, nor before q12's check has passed. One
torchrun launch: the "torch" case (harness/kinds/torch_schedule.py), and your step where no run is reused.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from lab_src.checks.common import errors, make_case, run_cases, run_dir, sources
from lab_src.checks.experiments import Runs, skipped_under_validate
from lab_src.grading import check_not_passed
from lab_src.pipeline.config import DEMO, LabConfig
from lab_src.pipeline.ops import letters
from lab_src.pipeline.schedules import compute_order
from lab_src.views.saved import case_view

QID = "q12"


@dataclass
class Bridge:
    """Your step's run and torch's on the same configuration: their views and each rank's order."""
    config: LabConfig
    yours: dict                                   # the view of your run (views/saved.py)
    theirs: dict                                  # the view of Schedule1F1B's run (compute only)

    def order(self, rank: int, view: str = "yours") -> str:
        """'F0 F1 F2 B0 ...': the forwards and backwards a rank ran, in your run or ("theirs") torch's."""
        events = (self.yours if view == "yours" else self.theirs)["events"]
        return letters([(e.kind, e.microbatch) for e in compute_order(events, rank)], 64)

    def orders(self) -> str:
        p, lines = self.config.num_stages, []
        for r in range(p):
            lines.append(f"  rank {r}: yours         {self.order(r)}\n"
                         f"          Schedule1F1B  {self.order(r, 'theirs')}")
        same = all(self.order(r) == self.order(r, "theirs") for r in range(p))
        head = ("the same order on every rank: your step is torch's Schedule1F1B" if same else
                "the orders differ (see the ranks below)")
        return (f"{QID} and torch.distributed.pipelining.Schedule1F1B, {self.config.describe()}: {head}\n"
                + "\n".join(lines) + "\n(the step times are no race: your run records every message and counts "
                "the memory it holds; torch's records its forwards and backwards only)")

    def __repr__(self) -> str:
        return self.orders()

    def figure(self):
        """Your step's measured timeline above Schedule1F1B's (its forwards and backwards; torch's messages
        are not traced), each on its own time axis."""
        from lab_src.views.static import figure
        from lab_src.views.timeline import prepare
        p, m = self.config.num_stages, self.config.num_microbatches
        yours = prepare(self.yours["events"], p, m, kind="your one_f_one_b_step")
        theirs = prepare(self.theirs["events"], p, m, kind="torch Schedule1F1B",
                         note="forwards and backwards only: torch's own messages are not traced")
        return figure([yours, theirs], f"your step and torch's Schedule1F1B on the same stages: "
                                       f"{self.config.describe()}")


def torch_bridge(runs: Runs | None = None, cfg: LabConfig = DEMO) -> Bridge | None:
    """Run torch's Schedule1F1B on the stages your answers build (`cfg`, 8 micro-batches), beside your 1F1B
    step (the bubble study's m = 8 run, from `runs`, where there is one; else a new run in the same launch)."""
    if skipped_under_validate("The bridge to torch's Schedule1F1B", "open the notebook and run the cell yourself"):
        return None
    not_passed = check_not_passed(QID)
    if not_passed:
        print(f"The bridge runs your step beside torch's, and the check above did not pass: make it pass first.\n"
              f"  {not_passed.splitlines()[0]}", file=sys.stderr)
        return None
    cfg = cfg.replace(num_microbatches=8)
    srcs = sources(QID)
    reusable = runs is not None and runs.config is not None and runs.config.replace(num_microbatches=8) == cfg
    yours = runs.views.get(("1f1b", 8)) if reusable else None
    cases = [make_case("torch", cfg, srcs, QID, label=f"{cfg.describe()}, torch's Schedule1F1B")]
    if yours is None:
        cases.append(make_case("pipeline", cfg, srcs, QID))
    print(f"torch's Schedule1F1B on your stages ({cfg.describe()})" +
          ("" if yours else ", and your step beside it") + " ...", flush=True)
    run = run_cases(cases, run_dir(QID + "-torch"), case_deadline_s=120, timeout_s=30)
    for out in run.outcomes:
        problems = errors(out, QID, out.case.label)
        if problems:
            from lab_src.judge.summary import summary
            print(f"{out.case.label}: the run failed\n" + summary(problems, 3), file=sys.stderr)
            return None
    theirs = run.outcomes[0]
    bridge = Bridge(cfg, yours or case_view(run.outcomes[1]), case_view(theirs))
    print(bridge.orders())
    return bridge
