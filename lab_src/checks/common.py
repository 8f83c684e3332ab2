"""What every visible check shares: the configuration, launching its cases, and its report.

A visible check (lab_src/checks/qNN_<function>.py) runs the student's own answers (this exercise's and
the earlier ones it builds on) in real torchrun processes on the CPU, in a few seconds, and returns a
`CheckReport`, passed or failed: what went wrong comes first, the cause before what it caused, each said
once (judge/summary.py), then what each case did, then what the ranks printed. A failed check does not
raise, so the notebook's next cell can draw the failing run (`report.timeline()`); `report.traceback`
keeps the full tracebacks, and `report.raise_if_failed()` turns a failure into `CheckFailed`. Missing
earlier answers are reported before anything is launched.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from lab_src import answers
from lab_src.grading import autograding, grader_view
from lab_src.harness.case import Case, CaseOutcome, Run
from lab_src.judge.failures import case_problems, not_run, sanitize
from lab_src.judge.problems import Problem, stamped
from lab_src.judge.summary import counts, render, wrap
from lab_src.pipeline.config import LabConfig
from lab_src.registry import exercise
from lab_src.views.saved import case_view, draw, kind_view  # noqa: F401  (q20-q22 import case_view from here)

VISIBLE = LabConfig()  # 8 layers, 4 stages, batch 8 in 4 micro-batches
OUTPUT_LINES = 6       # lines of each rank's output a report shows


class CheckFailed(AssertionError):
    pass


class CheckReport:
    """What a check found, and the events of each case it ran (for the timeline).

    `ok`, `problems` (causes first), `lines` (what each case did), `traceback` (every exception's full
    traceback), `outputs()` (what each rank printed), `timeline()`. `passed`: the parts of the check that
    passed, said right under a failed verdict's head, before its problems."""

    def __init__(self, qid: str, run: Run | None, problems: list[Problem], lines: list[str], views=None,
                 tracebacks: list[str] | None = None, skipped: bool = False, passed: list[str] | None = None):
        self.qid, self.run, self.problems, self.lines = qid, run, problems, lines
        self.passed = passed or []
        self.views = views if views is not None else [kind_view(o) for o in (run.outcomes if run else [])]
        self._tracebacks = tracebacks or []
        self.skipped = skipped            # while autograding: nothing was checked here
        self._failed: int | None = None   # failed_case(), kept by let_go() when the outcomes go

    @property
    def ok(self) -> bool:
        return not self.problems

    def timeline_events(self, case: int = 0):
        """The events `timeline(case)` draws, of the run's case number `case`: its outcome's
        `CaseOutcome.events(recovered=True)`, kept in the case's view."""
        return self.views[case]["events"]

    def stages(self, case: int = 0) -> int:
        return self.views[case]["stages"]

    def microbatches(self, case: int = 0) -> int:
        return self.views[case]["microbatches"]

    def observations(self, case: int = 0) -> dict[int, dict]:
        """What each rank observed in one case of the run (plain values: harness/observe.py, harness/kinds/)."""
        return dict(self.run.outcomes[case].obs) if self.run else {}

    def failed_case(self) -> int:
        """The first case that did not run cleanly or has a problem (0 when none)."""
        if self._failed is not None:
            return self._failed
        failed = {p.case for p in self.problems}
        outcomes = self.run.outcomes if self.run else []
        return next((i for i, o in enumerate(outcomes) if o.failure or o.errors() or o.case.label in failed), 0)

    def timeline(self, case: int | None = None):
        """The animated P2P timeline of one case of this run (a static figure while autograding): by
        default the first case that failed, with where each rank was left waiting."""
        if not self.views:
            print(nothing_to_draw(self))
            return None
        v = self.views[self.failed_case() if case is None else case]
        return draw(v, f"{self.qid}: {v.get('label') or ''}")

    @property
    def traceback(self) -> str:
        """Every exception's full traceback, torch's and the lab's frames included (for the curious:
        the messages above say what to change)."""
        return "\n".join(self._traceback_parts()) or "No exception was raised."

    def _traceback_parts(self) -> list[str]:
        parts = list(self._tracebacks)
        for o in (self.run.outcomes if self.run else []):
            for r, e in sorted(o.errors().items()):
                if e.get("traceback"):
                    parts.append(f"--- {o.case.label}, rank {r} ---\n{e['traceback']}")
        return parts

    def let_go(self) -> "CheckReport":
        """For a study the kernel keeps: hold only what its text and figures need (the problems, the lines, the
        views, whose events are the run's own, the tracebacks and which case failed) and let the launch's records
        go (every rank's observations); the study function, `released` (harness/memory_release.py), gives the
        memory back once it has returned. A study that kept them held up to 1,090 MiB in the kernel
        (benchmarks/README.md)."""
        if self.run is not None and self.run.outcomes:
            self._failed = self.failed_case()
            self._tracebacks = self._traceback_parts()
            self.run = replace(self.run, outcomes=[])
        return self

    def outputs(self) -> dict[int, str]:
        """What each rank printed (its whole log)."""
        if self.run is None:
            return {}
        from lab_src.harness import runfolder
        return {r: p.read_text(errors="replace") for r, p in runfolder.rank_logs(self.run.run_dir).items()}

    def raise_if_failed(self) -> "CheckReport":
        if not self.ok:
            raise CheckFailed("\n".join(self.verdict()))
        return self

    def verdict(self) -> list[str]:
        title = self.qid
        if self.skipped:
            return [f"{title}: not checked here while autograding"]
        if self.ok:
            return [f"{title}: all checks passed" if exercise(self.qid).function else f"{title}: the demo ran"]
        causes, caused = counts(self.problems)
        head = f"{title}: FAILED, {causes} problem{'s' if causes != 1 else ''}" + \
            (", and what it caused" if caused else "")
        return [head] + [part for line in self.passed for part in wrap(f"Passed: {line}")] + render(self.problems)

    def output_lines(self) -> list[str]:
        """The first lines each rank printed, and where the rest is."""
        shown = []
        for r, text in self.outputs().items():
            lines = [sanitize(ln) for ln in text.splitlines() if ln.strip()]
            shown += [f"  rank {r} | {ln[:160]}" for ln in lines[:OUTPUT_LINES]]
            if len(lines) > OUTPUT_LINES:
                shown.append(f"  rank {r} | ... {len(lines) - OUTPUT_LINES} more lines")
        if not shown:
            return []
        folder = _relative(self.run.run_dir)
        return [f"What the ranks printed (the first lines of each; all of it: {folder}/rank<r>.log):"] + shown

    def footer(self) -> list[str]:
        if self.ok or not self.views:
            return []
        return ["report.timeline() draws the run that failed; report.traceback holds the full tracebacks."]

    def text(self) -> str:
        parts = [self.verdict(), self.lines, self.output_lines(), self.footer()]
        return "\n\n".join("\n".join(p) for p in parts if p)

    def __repr__(self) -> str:
        return self.text()


def _relative(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


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


def study_sources(*qids: str) -> dict | None:
    """sources() of each of `qids`, for a study or an experiment (no check of its own): an answer still missing
    is said as what to do (the stub's message, on stderr) and None returned, not raised as a traceback
    through the lab."""
    srcs = {}
    try:
        for qid in qids:
            srcs.update(sources(qid))
    except answers.StubCalled as e:
        print(f"Nothing was run: {e}", file=sys.stderr, flush=True)
        return None
    return srcs


def run_dir(qid: str) -> Path:
    """A new folder under runs/ for a run of `qid` (an exercise, or an experiment: "q12-bubble"); the oldest
    runs of the same name beyond the last few are removed first (harness/runfolder.py, `prune`), and the
    oldest of all while runs/ weighs more than its cap (`cap_size`)."""
    from lab_src.harness.runfolder import cap_size, prune
    prune(Path("runs"), qid)
    cap_size(Path("runs"))
    return Path("runs") / f"{qid}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def run_cases(cases, folder, **kwargs) -> Run:
    """harness/runner.py's run_cases for a check or an experiment in a notebook: the run's observations, read
    into its outcomes, are not kept on disk (runfolder.drop_observations)."""
    from lab_src.harness import runner
    from lab_src.harness.runfolder import drop_observations
    run = runner.run_cases(cases, folder, **kwargs)
    drop_observations(run.run_dir)
    return run


def make_case(kind: str, cfg: LabConfig, srcs, qid: str, **extra) -> Case:
    """A case of `kind` on `cfg` testing `qid`, named by its configuration unless `label` says otherwise. It
    runs the step of `qid`'s exercise and is judged against its schedule, unless `step` and `schedule`
    (a variant of it: "interleaved:4", q15's with 4 chunks per rank) say otherwise."""
    ex = exercise(qid)
    extra = {"label": cfg.describe(), "schedule": ex.schedule_of_step, "step": ex.step_exercise, **extra}
    return Case(kind=kind, qid=qid, config=cfg, answers=srcs, **extra)


def errors(outcome: CaseOutcome, qid: str, label: str) -> list[Problem]:
    """What went wrong in a case that did not run cleanly, causes first (judge/failures.py). A case not run
    because earlier ones deadlocked or timed out follows from their problems: a consequence, said after them."""
    found = stamped(case_problems(outcome), qid, label)
    return [replace(p, consequence=True) for p in found] if not_run(outcome) else found


def finish(qid: str, run: Run | None, problems: list[Problem], lines: list[str],
           tracebacks: list[str] | None = None, views=None, cls: type = CheckReport,
           passed: list[str] | None = None) -> CheckReport:
    """The report of a check: printed (what went wrong first, on stderr, which a notebook shows in red)
    and returned, passed or failed. `cls`, `views`: a report of another kind (q14's knows the grid);
    `passed`: what passed, said before the problems of a failed report."""
    report = cls(qid, run, problems, lines, views, tracebacks=tracebacks, passed=passed)
    verdict = "\n".join(report.verdict())
    rest = "\n\n".join("\n".join(p) for p in (lines, report.output_lines(), report.footer()) if p)
    if report.ok:
        print(verdict + ("\n\n" + rest if rest else ""))
    else:
        sys.stdout.flush()
        print(verdict, file=sys.stderr, flush=True)
        print("\n" + rest if rest else "", flush=True)
    return report


def nothing_to_draw(report, what: str = "run") -> str:
    """Why a figure cell draws nothing: while autograding the check launched nothing (and the grader kept no run
    of this answer to show); otherwise the check stopped before launching anything."""
    if getattr(report, "skipped", False):
        return f"No {what} to draw: the visible check is skipped while autograding (the hidden tests' verdict is above)."
    return f"No {what} to draw: the check stopped before launching anything (see its message above)."


def autograding_report(qid: str) -> CheckReport:
    """While nbgrader executes a submission, checks launch nothing (the grader runs the hidden tests in
    its own processes). For the timeline, the report carries the grader's run of this answer, if saved."""
    lines = [f"{qid}: the visible check is skipped while autograding; the grader runs the hidden tests."]
    views = [v for v in [grader_view(qid)] if v is not None]
    if views:
        v = views[0]
        said = v.get("messages") or []
        lines.append(f"The timeline below is {v.get('title', 'the grader run of your answer')}"
                     + (f" ({v['label']})" if v.get("label") else "")
                     + (", which went wrong:" if said else ", which passed."))
        lines += ["  " + line for line in said]
    print("\n".join(lines))
    return CheckReport(qid, None, [], lines, views, skipped=True)


def failed_in_notebook(qid: str, error: BaseException) -> CheckReport | None:
    """The report of a check stopped in this notebook's own process by a missing or broken answer, or by
    an exception raised in the student's code (q04's baseline runs here): the message and the
    student's line, not the lab's traceback (kept in `report.traceback`). None for anything else (a
    fault of the lab's own, which should surface as it is)."""
    import traceback
    frames = [f for f in traceback.extract_tb(error.__traceback__) if _is_answer_file(f.filename)]
    if not isinstance(error, (answers.StubCalled, answers.AnswerError)) and not frames:
        return None
    message = f"{type(error).__name__}: {error}" if frames else str(error)
    if frames:
        f = frames[-1]
        message += f"\n    at {Path(f.filename).name} line {f.lineno}, in {f.name}: {f.line}"
    full = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return finish(qid, None, [Problem(message, exercise=qid)], [], tracebacks=[full])


def _is_answer_file(filename: str) -> bool:
    try:
        return Path(filename).resolve().parent == answers.answers_dir()
    except OSError:
        return False


UNFINISHED = "    did not finish: what went wrong is at the top; report.timeline() draws where each rank stopped"


def indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


class GridViewReport(CheckReport):
    """A check report whose views are runs on a data x pipeline grid (view["dp"], view["pp"]): one row per rank with
    its coordinates, one pipeline's theory of the bubble (q20, q21)."""

    def timeline(self, case: int | None = None):
        if not self.views:
            print(nothing_to_draw(self))
            return None
        from lab_src.topics.dp_pp.timeline import grid_figure, grid_timeline
        v = self.views[self.failed_case() if case is None else case]
        if os.environ.get("NBGRADER_EXECUTION"):
            return grid_figure(v["events"], v["dp"], v["pp"], v["microbatches"], v["title"], None, "")
        from lab_src.views.widget import TimelineWidget
        return TimelineWidget(grid_timeline(v["events"], v["dp"], v["pp"], v["microbatches"]), None, title=v["title"])


__all__ = ["VISIBLE", "CheckFailed", "CheckReport", "sources", "run_dir", "make_case", "errors", "finish",
           "failed_in_notebook", "autograding", "autograding_report", "indent", "run_cases", "UNFINISHED", "GridViewReport"]

