"""What every visible check shares: the configuration, launching its cases, and its report.

A visible check (lab_src/checks/qNN_<function>.py) runs the student's own answers (this exercise's and
the earlier ones it builds on) in real torchrun processes on the CPU, in a few seconds, and raises
`CheckFailed` with messages that name the exercise, rank and micro-batch when something is wrong.
Missing earlier answers are reported before anything is launched. The returned `CheckReport` holds the
run's events for the pictures.
"""
from __future__ import annotations

import os
import time
from pathlib import Path

from lab_src import answers
from lab_src.grading import autograding, grader_view
from lab_src.harness.case import Case
from lab_src.harness.runner import CaseOutcome, Run, run_cases
from lab_src.judge.problems import Problem, from_errors, summary
from lab_src.pipeline.config import LabConfig
from lab_src.registry import exercise
from lab_src.views.saved import case_view, draw

VISIBLE = LabConfig()  # 8 layers, 4 stages, batch 8 in 4 micro-batches


class CheckFailed(AssertionError):
    pass


class CheckReport:
    """What a check found, and the events of each case it ran (for the timeline)."""

    def __init__(self, qid: str, run: Run | None, problems: list[Problem], lines: list[str], views=None):
        self.qid, self.run, self.problems, self.lines = qid, run, problems, lines
        self.views = views if views is not None else [case_view(o) for o in (run.outcomes if run else [])]

    @property
    def ok(self) -> bool:
        return not self.problems

    def events(self, case: int = 0):
        return self.views[case]["events"]

    def stages(self, case: int = 0) -> int:
        return self.views[case]["stages"]

    def microbatches(self, case: int = 0) -> int:
        return self.views[case]["microbatches"]

    def timeline(self, case: int = 0):
        """The animated P2P timeline of one case of this run (a static figure while autograding)."""
        if not self.views:
            print("No run to draw: the check did not run.")
            return None
        v = self.views[case]
        return draw(v, f"{self.qid}: {v['stages']} stages, {v['microbatches']} micro-batches")

    def __repr__(self) -> str:
        return "\n".join(self.lines)


def sources(qid: str) -> dict[str, str | None]:
    """The student's answer files this check runs; a missing one is reported before anything launches."""
    ex = exercise(qid)
    ids = (*ex.needs, ex.id)
    srcs = answers.sources(ids)
    missing = [q for q in ids if srcs[q] is None]
    if missing:
        first = exercise(missing[0])
        rest = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise answers.StubCalled(answers.stub_message(first.id, caller=qid) + rest)
    return srcs


def run_dir(qid: str) -> Path:
    return Path("runs") / f"{qid}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def make_case(kind: str, cfg: LabConfig, srcs, qid: str, **extra) -> Case:
    return Case(kind=kind, qid=qid, config=cfg, answers=srcs, label=cfg.describe(), **extra)


def errors(outcome: CaseOutcome, qid: str, label: str) -> list[Problem]:
    if outcome.failure:
        return [Problem(qid, outcome.failure, None, None, label)]
    return from_errors(qid, outcome.errors(), label)


def finish(qid: str, run: Run | None, problems: list[Problem], lines: list[str]) -> CheckReport:
    report = CheckReport(qid, run, problems, lines)
    if problems:
        lines.append(f"\n{qid}: {len(problems)} problem(s)\n" + summary(problems))
    else:
        lines.append(f"\n{qid}: all checks passed")
    print("\n".join(lines))
    if problems:
        raise CheckFailed(f"{qid}: {len(problems)} problem(s)\n" + summary(problems))
    return report


def autograding_report(qid: str) -> CheckReport:
    """While nbgrader executes a submission, checks launch nothing (the grader runs the hidden tests in
    its own processes). For the timeline, the report carries the grader's run of this answer, if saved."""
    lines = [f"{qid}: the visible check is skipped while autograding; the grader runs the hidden tests."]
    views = [v for v in [grader_view(qid)] if v is not None]
    if views:
        lines.append(f"The timeline below is the grader's run of your answer ({views[0].get('title', '')}).")
    print("\n".join(lines))
    return CheckReport(qid, None, [], lines, views)


def indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


__all__ = ["VISIBLE", "CheckFailed", "CheckReport", "sources", "run_dir", "make_case", "errors", "finish",
           "autograding", "autograding_report", "indent", "run_cases"]
