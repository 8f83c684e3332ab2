"""The folder of one cluster grading run, <course>/cluster/<run>/, and the state of each student in it.

    run.json            the course, and every submission of the run (student list, array and merge job ids)
    lists/NNN.txt       the students of one submission, one a line: array task i grades lines i*K .. i*K+K-1
    template.db         the course's assignment without students: each task space starts from a copy
    spaces/<student>/   the published task space: a course folder with its own gradebook.db
    state/<student>.json  running / graded / failed, with the Slurm job, the node and the time
    logs/               Slurm's output of the array tasks and merge jobs

Everything lives on the file system the course is on (shared across nodes on a cluster); one writer
per file: the submitting command writes run.json and lists/, the task grading a student its state and space.
"""
from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

from lab_src.registry import ASSIGNMENT

from ..course import Course

RUNS_DIR = "cluster"
STATES = ("graded", "running", "failed", "waiting")


def write_json(path: Path, data: dict) -> None:
    """Write atomically (readers on other nodes never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


class Run:
    def __init__(self, course: Course, name: str):
        self.course = course
        self.name = name
        self.root = runs_dir(course) / name

    # ---- finding runs ---------------------------------------------------------------------
    @classmethod
    def create(cls, course: Course, name: str | None = None) -> "Run":
        name = name or time.strftime("run-%Y%m%d-%H%M%S")
        run = cls(course, name)
        if run.meta_path.exists():
            raise SystemExit(f"run {name} exists already in {run.root.parent}: choose another --run name")
        for sub in ("lists", "spaces", "state", "logs"):
            (run.root / sub).mkdir(parents=True, exist_ok=True)
        write_json(run.meta_path, {"course": str(course.root), "created": time.time(), "submissions": []})
        return run

    @classmethod
    def open(cls, course: Course, name: str | None = None) -> "Run":
        """The run called `name`, or the course's latest run."""
        if name is None:
            runs = sorted((p for p in runs_dir(course).glob("*/run.json")), key=lambda p: p.stat().st_mtime)
            if not runs:
                raise SystemExit(f"no cluster runs in {runs_dir(course)}: submit one with slurm/grade.sh")
            name = runs[-1].parent.name
        run = cls(course, name)
        if not run.meta_path.exists():
            raise SystemExit(f"no run {name} in {runs_dir(course)}")
        return run

    # ---- layout ---------------------------------------------------------------------------
    @property
    def meta_path(self) -> Path:
        return self.root / "run.json"

    @property
    def template_db(self) -> Path:
        return self.root / "template.db"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def space_dir(self, student: str) -> Path:
        return self.root / "spaces" / student

    def space(self, student: str) -> Course:
        return course_at(self.course, self.space_dir(student))

    def state_path(self, student: str) -> Path:
        return self.root / "state" / f"{student}.json"

    # ---- submissions ----------------------------------------------------------------------
    def meta(self) -> dict:
        return json.loads(self.meta_path.read_text())

    def add_list(self, students: list[str]) -> Path:
        lists = self.root / "lists"
        path = lists / f"{len(list(lists.glob('*.txt'))):03d}.txt"
        path.write_text("".join(f"{s}\n" for s in students))
        return path

    def record_submission(self, **fields) -> None:
        meta = self.meta()
        meta["submissions"].append({"time": time.time(), **fields})
        write_json(self.meta_path, meta)

    def students(self) -> list[str]:
        """Every student of the run, in the order first submitted."""
        seen: dict[str, None] = {}
        for path in sorted((self.root / "lists").glob("*.txt")):
            seen.update(dict.fromkeys(read_list(path)))
        return list(seen)

    def job_ids(self) -> set[str]:
        """The array and merge job ids of every submission (as sbatch printed them)."""
        return {str(s[k]) for s in self.meta()["submissions"] for k in ("array_job", "merge_job") if s.get(k)}

    # ---- state of each student ------------------------------------------------------------
    def state(self, student: str) -> dict | None:
        try:
            return json.loads(self.state_path(student).read_text())
        except FileNotFoundError:
            return None

    def write_state(self, student: str, state: str, **fields) -> None:
        write_json(self.state_path(student), {"student": student, "state": state, "time": time.time(), **fields})

    def progress(self, live_jobs: set[str] | None = None) -> dict[str, list[str]]:
        """Students by state. A student whose task is 'running' in a job that is no longer queued
        (`live_jobs`: the job ids squeue shows; None when unknown) died without a word: failed."""
        out: dict[str, list[str]] = {k: [] for k in STATES}
        for s in self.students():
            out[effective_state(self.state(s), live_jobs)].append(s)
        return out


def runs_dir(course: Course) -> Path:
    """<course>/cluster/ for the core assignment's runs, <course>/cluster/<assignment>/ for another's."""
    base = course.root / RUNS_DIR
    return base if course.assignment == ASSIGNMENT else base / course.assignment


def course_at(course: Course, root: Path) -> Course:
    """A course folder at `root` set up like `course` (same source, release, cell timeout)."""
    other = copy.copy(course)
    other.root = Path(root).resolve()
    return other


def effective_state(state: dict | None, live_jobs: set[str] | None) -> str:
    if state is None:
        return "waiting"
    if state["state"] == "running" and live_jobs is not None and str(state.get("job")) not in live_jobs:
        return "failed"
    return state["state"]


def read_list(path: Path) -> list[str]:
    return [ln.strip() for ln in Path(path).read_text().splitlines() if ln.strip()]


def chunk(students: list[str], index: int, per_task: int) -> list[str]:
    """The students array task `index` grades."""
    return students[index * per_task:(index + 1) * per_task]
