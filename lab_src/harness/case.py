"""The records that cross the check's process boundaries, typed and torch-free.

A `Case` is what a launch runs on ranks 0..stages-1, named for the exercise whose answer it tests. It
travels from the launching process to every torchrun rank as JSON (`to_dict` / `from_dict`), and comes
back inside a `CaseOutcome` for judging; the outcomes of one `run_cases` (harness/runner.py) make a
`Run`. A case's fields are plain values only: the answers are file paths, the baseline (if any) a file
the judging process wrote; nothing in a case tells a rank what the right answer is.

What a rank observed comes back as plain values (harness/observe.py); its error and its memory have
typed forms in harness/records.py (`RankError`, `Memory`), the operation it was in in pipeline/trace.py
(`Pending`), all re-exported here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from lab_src.harness.records import Memory, RankError
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.trace import Event, Pending
from lab_src.registry import exercise

if TYPE_CHECKING:
    from lab_src.harness.deadlock import Stuck
    from lab_src.harness.launcher import Launch

__all__ = ["Case", "CaseOutcome", "Run", "RankError", "Memory", "Pending"]


@dataclass
class Case:
    kind: str                                   # what the ranks do: see harness/kinds/__init__.py
    qid: str                                    # the exercise under test: its answer, its failures
    config: LabConfig
    answers: dict[str, str | None] = field(default_factory=dict)   # qid -> answer file (None: the stub)
    label: str = ""                             # the configuration's name in messages
    schedule: str = "afab"                      # the schedule a pipeline run is judged against
    step: str = ""                              # the exercise whose step function the case calls
                                                # ("": the one `qid` declares, registry's `step_exercise`)
    probes: list[str] = field(default_factory=list)   # extra calls of the student's checks (q07, q09, q10)
    calls: list = field(default_factory=list)   # unit calls ({"exercise", "args", "kwargs"}) or exercise ids
    baseline: str | None = None                 # the unsharded baseline's file, for the q09/q10 probes
    settings: dict = field(default_factory=dict)   # numbers of the kind (train: steps, lr, test_microbatches)
    stages: int = 0                             # ranks the case runs on (default: the config's stages)
    index: int = -1                             # its place in the launch (set by the runner)

    def __post_init__(self):
        if isinstance(self.config, dict):
            self.config = LabConfig.from_dict(self.config)
        self.stages = self.stages or self.config.num_stages
        self.label = self.label or self.kind
        self.step = self.step or exercise(self.qid).step_exercise

    @property
    def microbatches(self) -> int:
        return self.config.num_microbatches

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["config"] = self.config.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(**d)


@dataclass
class CaseOutcome:
    case: Case
    obs: dict[int, "observed.Observed"] = field(default_factory=dict)   # rank -> what it observed (harness/observed.py)
    failure: str | None = None                            # why the case did not complete, if it did not
    stuck: "Stuck | None" = None                          # the deadlock the run was stopped in, if it was
    stopped_at: float | None = None                       # when it was stopped (time.perf_counter)
    # rank -> what its journal says it did, for a rank that left no observations (for the pictures only)
    recovered: dict[int, dict] = field(default_factory=dict)
    # rank -> the compute operations and messages it began, [kind, micro-batch, chunk, when read], as the
    # launching process read them live from its journal (harness/case_watch.py `CaseWatch`; judge/record.py)
    observed: dict[int, list] = field(default_factory=dict)
    # rank -> the bytes the kernel counted on its connections over the case, read from outside it, where its kind
    # is judged on them (harness/wire.py `WireCount`; judge/wire.py); `wire_unseen`: the sandbox's loopback bytes
    # no connection read accounts for; `wire_failed`: why nothing could be read (then nothing is judged on it)
    wire: dict = field(default_factory=dict)
    # rank -> its backwards' begins and ends and the lab's marks, in its journal's order (harness/case_watch.py `order`)
    order: dict = field(default_factory=dict)
    wire_unseen: int | None = None
    wire_loopback: int | None = None        # all the sandbox's loopback carried over the case
    wire_failed: str | None = None

    def __post_init__(self):
        from lab_src.harness.observed import observed
        self.obs = {r: observed(self.case.kind, o) for r, o in self.obs.items()}

    def errors(self) -> dict[int, dict]:
        """rank -> its error, in the plain form the judges read (`RankError.to_dict`)."""
        return {r: o["error"] for r, o in self.obs.items() if o.get("error")}

    def _ranks(self, recovered: bool) -> dict[int, dict]:
        return {**{r: o for r, o in self.recovered.items() if recovered}, **self.obs}

    def _errors(self, recovered: bool) -> dict[int, RankError]:
        return {r: RankError.from_dict(o["error"]) for r, o in sorted(self._ranks(recovered).items())
                if o.get("error")}

    def _t0(self, recovered: bool) -> float:
        starts = [row[6] for o in self._ranks(recovered).values() for row in o.get("events", [])]
        starts += [e.pending_since for e in self._errors(recovered).values()
                   if recovered and e.pending_since is not None]
        return min(starts, default=0.0)

    def events(self, recovered: bool = False) -> list[Event]:
        """Every rank's events, on one clock whose zero is the case's first event. `recovered`: also
        those read from the journals of ranks that left no observations (for drawing a stopped run)."""
        t0 = self._t0(recovered)
        events = [Event.from_row(r) for o in self._ranks(recovered).values() for r in o.get("events", [])]
        events = [replace(e, t_start=e.t_start - t0, t_end=e.t_end - t0) for e in events]
        return sorted(events, key=lambda e: (e.t_start, e.rank))

    def waits(self) -> list[Event]:
        """The operations ranks were still in when the case ended (a receive whose message never came),
        from when they began to when the rank gave up or the run was stopped; on the clock of
        `events(recovered=True)`."""
        t0, out = self._t0(True), []
        for r, e in self._errors(True).items():
            if e.pending and e.pending_since is not None:
                p = e.pending
                end = e.at or self.stopped_at or e.pending_since
                out.append(Event(r, p.kind, p.microbatch, p.peer, None, 0, e.pending_since - t0, end - t0, p.chunk))
        return out

    def ends(self) -> list[tuple[int, float, str]]:
        """(rank, time, what) for each rank whose part ended in an exception outside any wait."""
        t0 = self._t0(True)
        return [(r, e.at - t0, f"raised {e.type}") for r, e in self._errors(False).items()
                if not e.pending and e.at and e.type != "StoppedWaiting"]


@dataclass
class Run:
    run_dir: Path
    outcomes: list[CaseOutcome]
    launches: list["Launch"]

    @property
    def wall_s(self) -> float:
        return sum(launch.wall_s for launch in self.launches)
