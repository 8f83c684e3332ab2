"""The unsharded baselines a launch's cases are compared with, one per configuration.

    baselines = baselines_for(configs, answers, folder)   # computed now, with `answers`' q04
    baselines[cfg]                                      # in memory: what the judging process compares with
    baselines.for_case(cfg, probes)                     # the file a case's ranks load, or None

Each distinct configuration's baseline is computed once (pipeline/baseline.py), on the device the
launch's ranks compute on, with as many threads as each rank has (LAB_OMP_THREADS, 1 by default), so
that both use the same kernels, and kept in memory for the process that judges. (A kernel's torch uses
every core: on a shared machine its thread pool waits for busy cores, and a baseline of the checks'
small model took 0.6-8 s with 2 threads against 0.13 s with one.) A file is written only where a rank in another process loads it: the probes of q09 and q10,
which call the student's checks with the baseline's outputs and gradients.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterable

from lab_src.answers import use_answers
from lab_src.harness.groups import device_for
from lab_src.pipeline.baseline import compute_baseline, save_baseline
from lab_src.pipeline.config import LabConfig

LOADED_BY = ("check_outputs", "check_gradients")   # the probes whose ranks load the baseline (q09, q10)


@contextlib.contextmanager
def threads_of_a_rank():
    """torch's intra-op threads set, for the block, to what each rank of a launch has."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(max(1, int(os.environ.get("LAB_OMP_THREADS", "1"))))
    try:
        yield
    finally:
        torch.set_num_threads(before)


class Baselines:
    """The baselines of some configurations, computed with the q04 of `answers` (qid -> answer file).

    `device`: where to compute them; by default the device a launch of each configuration's own ranks
    uses (harness/groups.py `device_for`). `folder`: where the files that ranks load are written."""

    def __init__(self, answers: dict[str, str | None], folder: Path | str | None = None, device: str | None = None):
        self.answers, self.device = dict(answers), device
        self.folder = Path(folder).resolve() if folder is not None else None
        self._computed: dict[LabConfig, dict] = {}
        self._files: dict[LabConfig, str] = {}

    def add(self, configs: Iterable[LabConfig]) -> "Baselines":
        """Compute the baselines of `configs` not computed yet."""
        with use_answers(self.answers), threads_of_a_rank():
            for cfg in configs:
                if cfg not in self._computed:
                    self._computed[cfg] = compute_baseline(cfg, self.device or device_for(cfg.world_size))
        return self

    def __getitem__(self, cfg: LabConfig) -> dict:
        return self.add([cfg])._computed[cfg]

    def __contains__(self, cfg: LabConfig) -> bool:
        return cfg in self._computed

    def perturbed(self, cfg: LabConfig, seed: int) -> dict:
        """The baseline of `cfg` with stage 0's embedding changed as a case's rank 0 changed it
        (pipeline/perturb.py): computed each time, never kept or written. With a rank's threads, as `add`: torch's
        default of one per core made each a busy wait for the others (1.0 CPU s and 4.6 s for six, against
        0.06 and 0.33 s, on 2 loaded cores)."""
        with use_answers(self.answers), threads_of_a_rank():
            return compute_baseline(cfg, self.device or device_for(cfg.world_size), perturbed=seed)

    def path(self, cfg: LabConfig) -> str:
        """The baseline of `cfg` as a file (written the first time it is asked for)."""
        if cfg not in self._files:
            if self.folder is None:
                raise ValueError(f"no folder to write the baseline of {cfg.describe()} to: give Baselines one")
            self._files[cfg] = str(save_baseline(self[cfg], self.folder / f"baseline-{cfg.key()}.pt"))
        return self._files[cfg]

    def for_case(self, cfg: LabConfig, probes: Iterable[str] = ()) -> str | None:
        """What a case of `cfg` with `probes` carries as its baseline: the file where its ranks load it,
        else None (the judging process compares with the baseline in memory)."""
        return self.path(cfg) if set(LOADED_BY) & set(probes) else None


def baselines_for(configs: Iterable[LabConfig], answers: dict[str, str | None], folder: Path | str | None = None,
                  device: str | None = None) -> Baselines:
    """The baselines of `configs`, each distinct one computed now (see `Baselines`)."""
    return Baselines(answers, folder, device).add(configs)
