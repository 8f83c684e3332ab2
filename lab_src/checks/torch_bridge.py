"""The bridge to the production API (q12, q15): your step and torch.distributed.pipelining's schedule of the
same name (Schedule1F1B, ScheduleInterleaved1F1B) on the same stages, where compute dominates, drawn one
above the other, with each rank's order beside the order torch's schedule ran (recorded from its calls to
its stages: topics/interleaved/kind_torch.py).

    bridge = torch_bridge(bubbles)          # q12: reuses your m = 8 run of the bubble study, if there is one
    bridge = interleaved_bridge(v=2)        # q15
    bridge.figure()

Ungraded; launches nothing under Validate or while autograding, nor before the exercise's check has passed.
One torchrun launch: the "torch" case, and your step where no run is reused.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from lab_src.checks.common import errors, make_case, run_cases, run_dir, sources
from lab_src.checks.experiments import Runs, latest, skipped_under_validate
from lab_src.grading import check_not_passed
from lab_src.harness.memory_release import released
from lab_src.pipeline.config import DEMO, LabConfig
from lab_src.pipeline.schedules import compute_order, schedule
from lab_src.views.saved import case_view

TORCH_NAMES = {"1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}


@dataclass
class Bridge:
    """Your step's run and torch's on the same configuration: their views and each rank's order."""
    qid: str
    config: LabConfig
    yours: dict                                   # the view of your run (views/saved.py)
    theirs: dict                                  # the view of torch's run (compute only)

    @property
    def chunks(self) -> int:
        return schedule(self.yours["schedule"]).chunks_per_rank

    @property
    def torch_name(self) -> str:
        return TORCH_NAMES["interleaved" if self.chunks > 1 else "1f1b"]

    def order(self, rank: int, view: str = "yours", limit: int = 24) -> str:
        """'F0 F1 F2 B0 ...' (with chunks: 'F0c0 F1c0 ...'): the forwards and backwards a rank ran, in your
        run or ("theirs") torch's, the first `limit` of them."""
        events = (self.yours if view == "yours" else self.theirs)["events"]
        words = [f"{'F' if e.kind == 'forward' else 'B'}{e.microbatch}" + (f"c{e.chunk}" if self.chunks > 1 else "")
                 for e in compute_order(events, rank)]
        return " ".join(words[:limit]) + (f" ... ({len(words)} in all)" if len(words) > limit else "")

    def orders(self) -> str:
        p, width = self.config.num_stages, len(self.torch_name) + 2
        lines = [f"  rank {r}: {'yours':<{width}}{self.order(r)}\n  {'':>6}  {self.torch_name:<{width}}"
                 f"{self.order(r, 'theirs')}" for r in range(p)]
        same = all(self.order(r, limit=10**6) == self.order(r, "theirs", limit=10**6) for r in range(p))
        head = (f"the same order on every rank: your step is torch's {self.torch_name}" if same else
                "the orders differ (see the ranks below)")
        return (f"{self.qid} and torch.distributed.pipelining.{self.torch_name}, {self.config.describe()}"
                + (f", {self.chunks} chunks per rank" if self.chunks > 1 else "") + f": {head}\n"
                + "\n".join(lines) + "\n(the step times are no race: your run records every message and counts "
                "the memory it holds; torch's records its forwards and backwards only)")

    def __repr__(self) -> str:
        return self.orders()

    def figure(self):
        """Your step's measured timeline above torch's (its forwards and backwards; torch's messages are not
        traced), each on its own time axis."""
        from lab_src.views.static import figure
        from lab_src.views.timeline import prepare
        p, m, v = self.config.num_stages, self.config.num_microbatches, self.chunks
        yours = prepare(self.yours["events"], p, m, chunks=v, kind=f"your {self.yours['step_name']}")
        theirs = prepare(self.theirs["events"], p, m, chunks=v, kind=f"torch {self.torch_name}",
                         note="forwards and backwards only: torch's own messages are not traced")
        return figure([yours, theirs], f"your step and torch's {self.torch_name} on the same stages: "
                                       f"{self.config.describe()}")


def _bridge(qid: str, cfg: LabConfig, sched: str, yours: dict | None, step_case) -> Bridge | None:
    """One launch: torch's schedule `sched` on `cfg` (and `step_case`, your step, unless `yours` is given)."""
    name = TORCH_NAMES["interleaved" if sched.startswith("interleaved") else "1f1b"]
    if skipped_under_validate(f"The bridge to torch's {name}", "open the notebook and run the cell yourself"):
        return None
    not_passed = check_not_passed(qid)
    if not_passed:
        print(f"The bridge runs your step beside torch's, and the check above did not pass: make it pass first.\n"
              f"  {not_passed.splitlines()[0]}", file=sys.stderr)
        return None
    srcs = sources(qid)
    cases = [make_case("torch", cfg, srcs, qid, schedule=sched, label=f"{cfg.describe()}, torch's {name}")]
    if yours is None:
        cases.append(step_case(srcs))
    print(f"torch's {name} on your stages ({cfg.describe()})" + ("" if yours else ", and your step beside it")
          + " ...", flush=True)
    run = run_cases(cases, run_dir(qid + "-torch"), case_deadline_s=120, timeout_s=30)
    for out in run.outcomes:
        problems = errors(out, qid, out.case.label)
        if problems:
            from lab_src.judge.summary import summary
            print(f"{out.case.label}: the run failed\n" + summary(problems, 3), file=sys.stderr)
            return None
    from lab_src.registry import exercise
    yours = dict(yours or case_view(run.outcomes[1]), step_name=exercise(qid).function)
    bridge = Bridge(qid, cfg, yours, case_view(run.outcomes[0]))
    print(bridge.orders())
    return bridge


@released
def torch_bridge(runs: Runs | None = None, cfg: LabConfig = DEMO) -> Bridge | None:
    """q12: torch's Schedule1F1B on the stages your answers build (`cfg`, 8 micro-batches) beside your 1F1B
    step (the bubble study's m = 8 run, from `runs`, or by default the last bubble study this kernel still holds,
    where there is one; else a new run in the same launch)."""
    runs = runs if runs is not None else latest("bubble")
    cfg = cfg.replace(num_microbatches=8)
    reusable = runs is not None and runs.config is not None and runs.config.replace(num_microbatches=8) == cfg
    yours = runs.views.get(("1f1b", 8)) if reusable else None
    return _bridge("q12", cfg, "1f1b", yours, lambda srcs: make_case("pipeline", cfg, srcs, "q12"))


@released
def interleaved_bridge(v: int = 2, stages: int | None = None) -> Bridge | None:
    """q15: torch's ScheduleInterleaved1F1B with `v` chunks per rank beside your interleaved step, on the
    bubble study's model (compute dominates), `stages` ranks (default 4, or 2 on fewer than 4 cores)."""
    from lab_src.checks.q15_interleaved_step import STUDY
    from lab_src.pipeline.schedules import Interleaved1F1B
    stages = stages or (4 if (os.cpu_count() or 1) >= 4 else 2)
    cfg = STUDY.replace(num_stages=stages, num_microbatches=2 * stages, global_batch_size=4 * stages)
    sched = Interleaved1F1B(v).name
    return _bridge("q15", cfg, sched, None,
                   lambda srcs: make_case("interleaved", cfg, srcs, "q15", schedule=sched,
                                          label=f"{cfg.describe()}, {v} chunks per rank"))
