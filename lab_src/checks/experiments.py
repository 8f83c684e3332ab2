"""Q12's experiments, run on the student's own steps: memory against the number of micro-batches, 1000
micro-batches through 4 stages, and the bubble against the number of micro-batches.

    runs = memory_vs_microbatches()          # your AFAB (q08) and 1F1B (q12), m = 4 ... 64, 4 stages
    runs.figure()                            # peak activation memory per rank against m, side by side
    thousand_microbatches(runs)              # 1F1B with m = 1000: time, and memory against m = 8
    bubbles = bubble_vs_microbatches()
    bubbles.figure()                         # measured bubble against (p-1)/(m+p-1) on the DEMO model
    bubbles.timeline(8)                      # your step with m = 8 there, beside the ideal view

Nothing here is graded. Each experiment is one torchrun launch of pipeline cases (harness/kinds/pipeline.py),
which count the bytes each rank holds for backward (harness/memory.py). Under Validate and while nbgrader
autogrades, they launch nothing (`skipped_under_validate()`, which q15's study shares).
"""
from __future__ import annotations

import os
import sys
import time
import weakref
from dataclasses import dataclass, field

from lab_src import answers
from lab_src.checks.common import VISIBLE, autograding, errors, make_case, run_cases, run_dir, sources
from lab_src.grading import validating
from lab_src.harness.memory_release import released
from lab_src.judge.summary import summary
from lab_src.pipeline.config import DEMO, LabConfig
from lab_src.pipeline.schedules import in_flight, schedule

MEMORY_MS = (4, 8, 16, 32, 64)
BUBBLE_MS = (1, 2, 4, 8, 16)
STEPS = {"afab": "q08", "1f1b": "q12"}       # the exercise whose step each schedule runs
# the last result of each experiment that the kernel still holds (a weak reference: `del runs` frees it), so that
# a later cell that builds on it (thousand_microbatches on the memory runs, torch_bridge on the bubble runs) runs
# on its own, in any order, and uses it when it is there
_latest: dict[str, weakref.ref] = {}


def latest(kind: str) -> "Runs | None":
    """The last `kind` experiment ("memory" or "bubble") still alive in this kernel, or None."""
    ref = _latest.get(kind)
    return ref() if ref is not None else None


def model_words(cfg: LabConfig, ms) -> str:
    """The model of an experiment over several m, without the one micro-batch count its configuration holds:
    "4 stages, 8 layers, hidden 256, sequence 128, batch 32 (micro-batches of 32 down to 2 samples)"."""
    sizes = sorted({cfg.global_batch_size // m for m in ms}, reverse=True) or [cfg.global_batch_size]
    span = f"of {sizes[0]}" if len(sizes) == 1 else f"of {sizes[0]} down to {sizes[-1]}"
    return (f"{cfg.num_stages} stages, {cfg.num_layers} layers, hidden {cfg.hidden_size}, sequence {cfg.seq_len}, "
            f"batch {cfg.global_batch_size} (micro-batches {span} samples)")


def skipped_under_validate(what: str = "This study", how: str = "run the cell yourself to see it") -> bool:
    """True, after printing one line, while nbgrader validates or autogrades the notebook: an ungraded study
    or experiment then launches nothing, so that every cell stays within nbgrader's 30 s a cell. False
    otherwise (the student runs the notebook): run it. `how`: how to run it yourself."""
    if validating():
        print(f"{what} is skipped under Validate (it is not graded, and it takes longer than nbgrader's 30 s "
              f"a cell): {how}.")
        return True
    if autograding():
        print(f"{what} is skipped while autograding (it is not graded).")
        return True
    return False


def study_held_back(qid: str, what: str, how: str, runs: str) -> bool:
    """True, after saying why, where a study must launch nothing: while autograding, under Validate (an ungraded
    study), or after `qid`'s check failed in this kernel (it runs the answer the check judged). `what`: the study
    ("The bubble study"); `how`: how to run it yourself; `runs`: what it runs ("The study runs your step")."""
    from lab_src.grading import check_not_passed
    if autograding():
        print(f"{what} is skipped while autograding.")
        return True
    if skipped_under_validate(what, how):
        return True
    not_passed = check_not_passed(qid)
    if not_passed:
        print(f"{runs}, and the check above did not pass: make it pass first.\n  {not_passed.splitlines()[0]}",
              file=sys.stderr)
        return True
    return False


def small(m: int) -> LabConfig:
    """The check's small model on 4 stages, micro-batches of 2 samples, m of them."""
    return VISIBLE.replace(num_microbatches=m, global_batch_size=2 * m)


def _answers(schedules) -> tuple[dict, list[str]]:
    """The student's answers the steps of `schedules` need, and the schedules left out for a missing one."""
    srcs, skipped = {}, []
    for name in schedules:
        try:
            srcs.update(sources(STEPS[name]))
        except answers.StubCalled as e:
            if name == "1f1b":      # every experiment runs 1F1B: nothing to run (said, not a traceback)
                print(f"Nothing was run: {e}", file=sys.stderr, flush=True)
                return None, []
            skipped.append(f"{schedule(name).title} left out: {e}")
    return srcs, skipped


@dataclass
class Runs:
    """Peak activation memory (bytes saved for backward), micro-batches held and bubble, per run and rank."""
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    kind: str = "memory"                  # what figure() draws: "memory" or "bubble"
    config: LabConfig | None = None       # the configuration of a bubble experiment
    views: dict = field(default_factory=dict, repr=False)    # (schedule, m) -> the run's view, for timeline()

    def add(self, sched: str, m: int, out, cfg: LabConfig) -> None:
        from lab_src.views.bubble import measured_bubble
        problems = errors(out, STEPS[sched], cfg.describe())
        if problems:
            self.notes.append(f"{schedule(sched).title}, m = {m}: the run failed\n" + summary(problems, 3))
            return
        events = out.events()
        emulated = None
        if self.kind == "bubble":           # a run where compute dominates: worth drawing (timeline())
            from lab_src.views.emulated import emulated_events
            from lab_src.views.saved import case_view
            view = self.views[sched, m] = case_view(out)
            view["emulate"] = {}            # its second view: this run's order with emulated compute
            replayed = emulated_events(events, cfg.num_stages, stage_layers=view["stage_layers"])
            emulated = measured_bubble(replayed, cfg.num_stages) if replayed else None
        span = max((e.t_end for e in events), default=0.0)
        self.rows.append({"schedule": sched, "m": m, "step_s": span, "bubble": measured_bubble(events, cfg.num_stages),
                          "emulated": emulated,
                          "peak": {r: out.obs[r].get("memory", {}).get("peak_saved_bytes", 0) for r in sorted(out.obs)},
                          "held": {r: max(in_flight(events, r), default=0) for r in sorted(out.obs)}})

    def of(self, sched: str) -> list[dict]:
        return [row for row in self.rows if row["schedule"] == sched]

    def table(self) -> str:
        lines = [f"{'schedule':<26}{'m':>6}  peak activation memory per rank (MiB), micro-batches held"]
        for row in self.rows:
            ranks = "  ".join(f"r{r} {v / 2**20:7.3f} ({row['held'][r]:>3})" for r, v in row["peak"].items())
            lines.append(f"{schedule(row['schedule']).title:<26}{row['m']:>6}  {ranks}")
        return "\n".join(lines + self.notes)

    def __repr__(self) -> str:
        return self.table()

    def figure(self):
        from lab_src.views.experiments import bubble_figure, memory_figure
        return bubble_figure(self) if self.kind == "bubble" else memory_figure(self)

    def timeline(self, m: int = 8, sched: str = "1f1b"):
        """Your step's timeline in the bubble experiment's run with `m` micro-batches, where compute dominates
        (so the schedule shows, not the messages), with the ideal view of the same schedule under it."""
        from lab_src.views.saved import draw
        view = self.views.get((sched, m))
        if view is None:
            print(f"No run with m = {m} to draw (runs: {', '.join(str(k) for _, k in self.views) or 'none'}).")
            return None
        return draw(view, f"your {schedule(sched).title} step where compute dominates: {view['label']}")


def _launch(plan: list[tuple[str, LabConfig]], srcs: dict, label: str, deadline_s: float) -> tuple[list, float]:
    cases = [make_case("pipeline", cfg, srcs, STEPS[sched], schedule=sched, step=STEPS[sched]) for sched, cfg in plan]
    started = time.monotonic()
    run = run_cases(cases, run_dir(label), case_deadline_s=deadline_s, timeout_s=max(10.0, deadline_s / 4))
    return run.outcomes, time.monotonic() - started


@released
def memory_vs_microbatches(ms=MEMORY_MS, schedules=("afab", "1f1b")) -> Runs | None:
    """Your AFAB and 1F1B steps on 4 stages for each m in `ms`: the peak bytes each rank held for backward."""
    if skipped_under_validate():
        return None
    srcs, skipped = _answers(schedules)
    if srcs is None:
        return None
    plan = [(s, small(m)) for m in ms for s in schedules if not any(schedule(s).title in n for n in skipped)]
    print(f"{len(plan)} runs of the small model on 4 stages (m = {', '.join(map(str, ms))}) in one launch ...",
          flush=True)
    outcomes, wall = _launch(plan, srcs, "q12-memory", 120.0)
    runs = Runs(notes=skipped, wall_s=wall)
    for (sched, cfg), out in zip(plan, outcomes):
        runs.add(sched, cfg.num_microbatches, out, cfg)
    outcomes = out = None       # the rows and views hold what the figures need: the rest can go
    print(runs.table() + f"\n({wall:.0f} s, torchrun start included)")
    _latest["memory"] = weakref.ref(runs)
    return runs


@released
def thousand_microbatches(m: int = 1000, runs: Runs | None = None) -> Runs | None:
    """Your 1F1B step with `m` micro-batches on 4 stages, beside m = 8: how long it takes, and how much
    memory each rank holds. With `runs` (memory_vs_microbatches; by default the last one this kernel still holds),
    also what AFAB would hold at `m`."""
    if skipped_under_validate():
        return None
    srcs, _ = _answers(("1f1b",))
    if srcs is None:
        return None
    runs = runs if runs is not None else latest("memory")
    plan = [("1f1b", small(8)), ("1f1b", small(m))]
    print(f"1F1B on 4 stages with m = 8, then m = {m} ({small(m).global_batch_size} samples) ...", flush=True)
    outcomes, wall = _launch(plan, srcs, "q12-thousand", 900.0)
    result = Runs(wall_s=wall)
    for (sched, cfg), out in zip(plan, outcomes):
        result.add(sched, cfg.num_microbatches, out, cfg)
    outcomes = out = None       # the rows and views hold what the figures need: the rest can go
    if len(result.rows) < 2:
        print("\n".join(result.notes))
        return result
    eight, many = result.rows
    lines = [f"m = {m}: the step took {many['step_s']:.1f} s ({many['step_s'] / m * 1e3:.1f} ms per micro-batch; "
             f"the whole launch {wall:.0f} s)",
             f"{'rank':>6}{'peak at m = 8':>16}{f'peak at m = {m}':>18}{'ratio':>8}{'held':>6}"]
    for r in eight["peak"]:
        a, b = eight["peak"][r], many["peak"][r]
        lines.append(f"{r:>6}{a / 2**20:>12.3f} MiB{b / 2**20:>14.3f} MiB{b / a if a else float('nan'):>8.3f}"
                     f"{many['held'][r]:>6}")
    worst = max(abs(many["peak"][r] / eight["peak"][r] - 1) for r in eight["peak"] if eight["peak"][r])
    lines.append(f"largest change from m = 8: {worst:.1%} ({'within' if worst <= 0.10 else 'NOT within'} 10 %)")
    afab = {row["m"]: row["peak"][0] for row in (runs.of("afab") if runs else [])}
    if afab:
        top = max(afab)
        lines.append(f"AFAB's rank 0 held {afab[top] / 2**20:.2f} MiB at m = {top}; growing linearly, it would hold "
                     f"about {afab[top] / top * m / 2**20:.0f} MiB at m = {m}")
    print("\n".join(lines))
    return result


@released
def bubble_vs_microbatches(ms=BUBBLE_MS, cfg: LabConfig = DEMO, sched: str = "1f1b") -> Runs | None:
    """Your step of `sched` on the DEMO model (compute dominates messaging) for each m in `ms`: the
    measured bubble beside (p-1)/(m+p-1)."""
    if skipped_under_validate():
        return None
    srcs, _ = _answers((sched,))
    if srcs is None:
        return None
    plan = [(sched, cfg.replace(num_microbatches=m)) for m in ms if cfg.global_batch_size % m == 0]
    print(f"{schedule(sched).title} on the DEMO model ({model_words(cfg, [c.num_microbatches for _, c in plan])}) "
          f"for m = {', '.join(str(c.num_microbatches) for _, c in plan)} ...", flush=True)
    outcomes, wall = _launch(plan, srcs, "q12-bubble", 300.0)
    runs = Runs(wall_s=wall, kind="bubble", config=cfg)
    for (s, c), out in zip(plan, outcomes):
        runs.add(s, c.num_microbatches, out, c)
    outcomes = out = None       # the rows and views hold what the figures need: the rest can go
    from lab_src.views.bubble import theoretical_bubble
    p = cfg.num_stages
    lines = [f"{'m':>4}{'emulated':>10}{'theory':>9}{'measured':>10}  step (measured)"]
    for row in runs.rows:
        got, emu = ("n/a" if x is None else f"{x:.1%}" for x in (row["bubble"], row["emulated"]))
        lines.append(f"{row['m']:>4}{emu:>10}{theoretical_bubble(p, row['m']):>9.1%}{got:>10}  "
                     f"{row['step_s'] * 1e3:.0f} ms" + ("   (naive model parallelism)" if row["m"] == 1 else ""))
    cores = os.cpu_count() or 1
    lines += ["emulated compute: your run's own operations in its order, each box the median of its kind in this run, "
              "messages at the cost model's price, no CPU shared (lab_src/views/emulated.py)",
              f"measured: the wall clock of the same run{f'; {p} ranks share {cores} cores here, so a rank also waits for a core' if cores < p else ''}"]
    print("\n".join(lines + runs.notes))
    _latest["bubble"] = weakref.ref(runs)
    return runs
