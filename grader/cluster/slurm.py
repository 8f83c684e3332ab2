"""Talking to Slurm: sbatch the job array and its merge job, and ask squeue what is still queued.

The grading tasks get the #SBATCH defaults of slurm/grade.sh (CPUs, memory, time), overridden by the
options of `Resources` (on the command line, or GRADE_* variables). The merge job asks for little.
"""
from __future__ import annotations

import getpass
import math
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .. import ROOT
from .runs import Run

GRADE_SH = ROOT / "slurm" / "grade.sh"
MAX_ARRAY_TASKS = 1000          # Slurm's default MaxArraySize is 1001 (indices 0..1000)
MERGE_RESOURCES = ["--cpus-per-task=1", "--mem=2G", "--time=00:30:00"]
SLURM_TIMEOUT_S = 60


@dataclass
class Resources:
    """What each grading task asks for; None leaves grade.sh's #SBATCH default (or the site's)."""
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    cpus: int | None = None
    mem: str | None = None
    gpus: int | None = None
    per_task: int | None = None      # students per array task
    tasks: int | None = None         # or: the number of array tasks
    max_running: int | None = None   # the %N of --array: tasks running at once
    extra: list[str] = field(default_factory=list)   # any other sbatch options, for tasks and merge

    def students_per_task(self, n: int) -> int:
        if self.per_task:
            k = self.per_task
        elif self.tasks:
            k = math.ceil(n / self.tasks)
        else:
            k = 1
        return max(k, math.ceil(n / MAX_ARRAY_TASKS), 1)


def plan(run: Run, list_path: Path, n_students: int, res: Resources, script: Path = GRADE_SH) -> dict:
    """The sbatch command lines of the array and of its merge job ("{array}" stands for the array's id)."""
    per_task = res.students_per_task(n_students)
    n_tasks = math.ceil(n_students / per_task)
    course = str(run.course.root)
    common = ["sbatch", "--parsable", "--export=ALL"]
    common += [f"--partition={res.partition}"] if res.partition else []
    common += [f"--account={res.account}"] if res.account else []
    common += list(res.extra)
    array = common + ["--job-name=pp-lab-grade", f"--array=0-{n_tasks - 1}"
                      + (f"%{res.max_running}" if res.max_running else ""), f"--output={run.logs}/task-%A_%a.out"]
    array += [f"--time={res.time}"] if res.time else []
    array += [f"--cpus-per-task={res.cpus}"] if res.cpus else []
    array += [f"--mem={res.mem}"] if res.mem else []
    array += [f"--gres=gpu:{res.gpus}"] if res.gpus else []
    array += [str(script), "task", "--course", course, "--assignment", run.course.assignment, "--run", run.name, "--list", str(list_path),
              "--per-task", str(per_task)]
    merge = common + ["--job-name=pp-lab-merge", "--dependency=afterany:{array}", f"--output={run.logs}/merge-%j.out",
                      *MERGE_RESOURCES, str(script), "merge", "--course", course, "--assignment", run.course.assignment,
                      "--run", run.name]
    return {"array_cmd": array, "merge_cmd": merge, "per_task": per_task, "tasks": n_tasks}


def sbatch(argv: list[str]) -> str:
    """Run an sbatch command line; the job id it printed."""
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    if proc.returncode != 0:
        raise SystemExit(f"sbatch failed ({proc.returncode}): {proc.stderr.strip()}\n  {shlex.join(argv)}")
    return proc.stdout.strip().split(";")[0]


def submit(run: Run, students: list[str], res: Resources, dry_run: bool = False) -> dict:
    """Submit `students` of `run`: a job array and a merge job after it. Returns what was submitted."""
    list_path = run.root / "lists" / "NNN.txt" if dry_run else run.add_list(students)
    sub = {"list": list_path.name, "students": len(students), **plan(run, list_path, len(students), res)}
    if dry_run:
        return sub
    sub["array_job"] = sbatch(sub["array_cmd"])
    sub["merge_cmd"] = [a.replace("{array}", sub["array_job"]) for a in sub["merge_cmd"]]
    try:
        sub["merge_job"] = sbatch(sub["merge_cmd"])
    finally:  # the array is queued whatever happens to its merge job: remember it
        run.record_submission(**sub)
    return sub


def queued_jobs() -> set[str] | None:
    """Ids of this user's queued jobs, each array task by its own id and by its array's; None when
    squeue is not there or does not answer (then nothing can be said about lost tasks)."""
    if not shutil.which("squeue"):
        return None
    try:
        proc = subprocess.run(["squeue", "-h", "-u", os.environ.get("USER") or getpass.getuser(), "-o", "%A %F"],
                              capture_output=True, text=True, timeout=SLURM_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return set(proc.stdout.split()) - {"N/A"}
