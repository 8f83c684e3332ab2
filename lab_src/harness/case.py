"""One check case: what a launch runs on ranks 0..stages-1, named for the exercise whose answer it tests.

A case travels from the launching process to every torchrun rank as JSON (`to_dict` / `from_dict`),
and comes back inside a `CaseOutcome` for judging. Its fields are plain values only: the answers are
file paths, the baseline (if any) a file the judging process wrote; nothing in a case tells a rank
what the right answer is.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lab_src.pipeline.config import LabConfig


@dataclass
class Case:
    kind: str                                   # what the ranks do: see harness/cases.py KINDS
    qid: str                                    # the exercise under test: its answer, its failures
    config: LabConfig
    answers: dict[str, str | None] = field(default_factory=dict)   # qid -> answer file (None: the stub)
    label: str = ""                             # the configuration's name in messages
    schedule: str = "afab"                      # the schedule a pipeline run is judged against
    step: str = "q08"                           # the exercise whose step function a pipeline case calls
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
