"""An nbgrader course folder for this lab, and running nbgrader in it.

The course folder (default: ./course, or --course DIR) holds what nbgrader accumulates: submitted/,
autograded/, feedback/, gradebook.db, and the nbgrader_config.py written here; its course.toml (grader/plan.py)
says which modules the course hands out, each one nbgrader assignment. A `Course` acts on one assignment
at a time (`course.assignment`; `course.for_assignment(name)` for another). The source notebooks
stay in the repository's solutions/ and the release in notebooks/; the config points nbgrader at them
with absolute paths, so one checkout can serve several course folders (one per Slurm task, say).
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from lab_src.harness import limits
from lab_src.registry import ASSIGNMENT, EXERCISES

from . import RELEASE, ROOT, SOURCE, plan as course_plan
from .index import write_index

COURSE_ID = "pipeline-lab"

# Files a run of a notebook leaves beside it, which must never ship or be collected as part of the release.
IGNORE = [".ipynb_checkpoints", "*.pyc", "__pycache__", "answers", "runs", "feedback", ".*", "*.log",
          "*.py"]  # the jupytext twins of the source notebooks (grader/notebook_text.py) stay out of the release

CONFIG = '''\
# Written by grader/course.py; edit that file instead, this one is rewritten on every grader command.
c = get_config()
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = {source!r}
c.CourseDirectory.release_directory = {release!r}
c.CourseDirectory.db_url = {db_url!r}
c.CourseDirectory.ignore = {ignore!r}
# A student's deleted or edited test cell is restored from the source notebook and scored.
c.OverwriteCells.add_missing_cells = True
# nbgrader makes autograded notebooks read-only (444); the grader then writes the verdicts into them, which
# only root could do: keep them writable by the grading user (an instructor's account on a hub)
c.Autograde.permissions = 644          # nbgrader reads the digits as octal
# Per-cell limit while autograding; a hung cell fails, the notebook goes on.
c.Execute.timeout = {cell_timeout}
c.Execute.interrupt_on_timeout = True
# After a cell's reply, the output still on its way (a student printing megabytes, on a loaded node) is awaited
# this long; nbgrader raises past it and the whole assignment fails (nbclient's 4 s by default)
c.Execute.iopub_timeout = {iopub_timeout}
# The kernels that execute submitted notebooks run in the grading sandbox (grader/kernel_sandbox.py).
c.Execute.kernel_manager_class = "grader.kernel_sandbox.SandboxedKernelManager"
# Kernel start on a loaded node (other students' hidden tests busy on every core): a longer limit than
# nbgrader's 60 s, and one fresh start when a kernel still does not answer (grader/execute.py).
c.Execute.startup_timeout = {startup_timeout}
c.RetryingExecute.startup_retries = {startup_retries}
# Huge outputs (a student printing megabytes) are cut down in the autograded notebook.
c.LimitOutput.max_lines = {output_max_lines}
c.LimitOutput.max_traceback = {output_max_traceback}
# ... and by characters, right after nbgrader's own LimitOutput (one print of megabytes is one line)
from nbgrader.converters.autograde import Autograde as _Autograde
from nbgrader.preprocessors import LimitOutput as _LimitOutput
_steps = list(_Autograde.class_traits()["autograde_preprocessors"].default())
_steps.insert(_steps.index(_LimitOutput) + 1, "grader.limit_output.LimitOutputChars")
from nbgrader.preprocessors import Execute as _Execute
_steps[_steps.index(_Execute)] = "grader.execute.RetryingExecute"
c.Autograde.autograde_preprocessors = _steps
# Feedback shows each hidden-test verdict, never the hidden tests' code.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
c.ClearHiddenTests.enforce_metadata = False
# nbgrader zip_collect: archives whose entries are <student>/<notebook>.ipynb
c.ZipCollectApp.collector_plugin = "nbgrader.plugins.zipcollect.FileNameCollectorPlugin"
c.FileNameCollectorPlugin.named_regexp = r".*/(?P<student_id>[A-Za-z0-9_.@-]+)/(?P<file_id>{notebooks})$"
'''


def tool_env() -> dict:
    """PYTHONPATH for tools run from this checkout (nbgrader loads grader/ plugins; the grader's
    processes import grader/). PATH already leads with this environment's bin/ (grader/__init__.py)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


# nbgrader's exchange (release, fetch, submit, collect, feedback), for a course run without JupyterHub:
# a folder every user of the machine can write. Without one, the formgrader's Manage Assignments page
# warns that the exchange is missing and leaves its Release and Collect columns empty. Course(exchange=DIR)
# writes it into the course's config; a course folder that holds an exchange/ folder uses that one.
EXCHANGE = '''
c.Exchange.root = {exchange!r}
'''


def write_if_changed(path: Path, text: str) -> None:
    """Write `text` to `path` only where it differs, and whole at once: into a file of this thread's own, then
    renamed over it. Several gradings at once (threads of one process: grader/autograde.py `grade_all`) write the
    course's config before each nbgrader command, and an nbgrader starting then read the config truncated to
    nothing by a plain rewrite: it graded with nbgrader's defaults, its kernels outside the grading sandbox and a
    cell's limit of 30 s (jun's q03 in a CI run: a cell cut off at 30 s, no kernel start of grader/execute.py's)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


class Course:
    def __init__(self, root: Path | str = "course", cell_timeout: int = limits.CELL_TIMEOUT_S, release: Path = RELEASE,
                 source: Path = SOURCE, startup_timeout: int = limits.KERNEL_STARTUP_TIMEOUT_S,
                 startup_retries: int = limits.KERNEL_START_RETRIES,
                 exchange: Path | str | None = None, assignment: str | None = None):
        self.root = Path(root).resolve()
        self.plan = course_plan.load(self.root)
        self.assignment = self.plan.choose(assignment)[0]
        if exchange is None and (self.root / "exchange").is_dir():
            exchange = self.root / "exchange"   # a course folder with an exchange/ of its own keeps using it
        self.exchange = Path(exchange).resolve() if exchange else None
        self.cell_timeout = cell_timeout
        self.startup_timeout, self.startup_retries = startup_timeout, startup_retries
        # where generate_assignment reads and writes (tests point them at temporary folders). The repository's
        # notebooks/ hold the default course's release, tracked and tested against its source: a course of its own
        # modules, due dates or points (its index says "Assignment 1 of 1", its dates) releases into its folder
        if Path(release).resolve() == RELEASE.resolve() and not self.plan.is_default():
            release = self.root / "release"
        self.release = Path(release).resolve()
        self.source = Path(source).resolve()

    def for_assignment(self, assignment: str) -> "Course":
        """This course, acting on `assignment` (one of its plan's)."""
        other = copy.copy(self)
        other.assignment = self.plan.choose(assignment)[0]
        return other

    def of(self, qid: str) -> "Course":
        """This course, acting on the assignment that holds exercise `qid`."""
        return self.for_assignment(EXERCISES[qid].assignment)

    def each(self, assignment: str | None = None) -> list["Course"]:
        """This course once per assignment it acts on: `assignment`, or every one of the plan."""
        return [self.for_assignment(a) for a in self.plan.choose(assignment)]

    @property
    def exercises(self) -> list:
        return self.plan.exercises(self.assignment)

    # ---- layout --------------------------------------------------------------------------
    @property
    def db_path(self) -> Path:
        return self.root / "gradebook.db"

    def submitted(self, student: str = "") -> Path:
        return self.root / "submitted" / student / self.assignment if student else self.root / "submitted"

    def autograded(self, student: str) -> Path:
        return self.root / "autograded" / student / self.assignment

    def feedback(self, student: str) -> Path:
        return self.root / "feedback" / student / self.assignment

    @property
    def grading_root(self) -> Path:
        """course/grader/ for the core assignment (as when it was the only one), course/grader.<assignment>/
        for another: each assignment's grading kept apart, so that grading one never touches another's."""
        return self.root / ("grader" if self.assignment == ASSIGNMENT else f"grader.{self.assignment}")

    def grading_dir(self, student: str) -> Path:
        """Where grading `student`'s submission keeps its status, logs and verdicts (and, in <assignment>/,
        the copy nbgrader autogrades: staging.py)."""
        return self.grading_root / student

    def students(self) -> list[str]:
        base = self.root / "submitted"
        return sorted(p.name for p in base.iterdir() if (p / self.assignment).is_dir()) if base.exists() else []

    # ---- nbgrader ------------------------------------------------------------------------
    def write_config(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "nbgrader_config.py"
        source = self._patched_source() if self.plan.points else self.source
        write_if_changed(path, CONFIG.format(course_id=COURSE_ID, root=str(self.root), source=str(source),
                                      release=str(self.release), db_url=f"sqlite:///{self.db_path}",
                                      ignore=IGNORE, cell_timeout=self.cell_timeout, iopub_timeout=limits.IOPUB_TIMEOUT_S,
                                      notebooks=self.notebook_pattern(),
                                      startup_timeout=self.startup_timeout, startup_retries=self.startup_retries,
                                      output_max_lines=limits.OUTPUT_MAX_LINES,
                                      output_max_traceback=limits.OUTPUT_MAX_TRACEBACK)
                         + (EXCHANGE.format(exchange=str(self.exchange)) if self.exchange else ""))
        if self.exchange and not self.exchange.is_dir():
            self.exchange.mkdir(parents=True)
            self.exchange.chmod(0o777)   # what nbgrader asks of an exchange: every user writes there
        return path

    def notebook_pattern(self) -> str:
        """A regular expression matching exactly this assignment's notebook names (for nbgrader zip_collect)."""
        return "(?:" + "|".join(re.escape(e.notebook) for e in self.exercises) + ")"

    def _patched_source(self) -> Path:
        """course.toml gives other points: the source notebooks with those points, in the course folder
        (each file written only when it changes: several gradings at once call nbgrader here)."""
        out = self.root / "source"
        for a in self.plan.modules:
            (out / a).mkdir(parents=True, exist_ok=True)
            points = {ex.hidden_cell: self.plan.points[ex.id] for ex in self.plan.exercises(a) if ex.id in self.plan.points}
            for src in (self.source / a).iterdir():
                if not src.is_file():
                    continue
                text = src.read_text()
                if src.suffix == ".ipynb" and points:
                    nb = json.loads(text)
                    for cell in nb["cells"]:
                        meta = cell.get("metadata", {}).get("nbgrader", {})
                        if meta.get("grade_id") in points:
                            meta["points"] = points[meta["grade_id"]]
                    text = json.dumps(nb, indent=1, ensure_ascii=False) + "\n"
                write_if_changed(out / a / src.name, text)
        return out

    def hidden_points(self) -> dict[str, float]:
        """{qid: autograded points} of this course: its course.toml's, else the source notebooks'."""
        return {**hidden_points(), **self.plan.points}

    def nbgrader(self, *args: str, timeout: float | None = None, check: bool = True,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `nbgrader <args>` in the course folder with this interpreter's environment."""
        self.write_config()
        full_env = {**os.environ, **tool_env(), **(env or {})}
        # through grader/lean_imports.py: nbgrader without an import it never uses (0.75 s of CPU a command)
        proc = subprocess.run([sys.executable, "-m", "grader.lean_imports", "nbgrader", *args], cwd=self.root, env=full_env,
                              capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"nbgrader {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                               f"\n{proc.stderr[-5000:]}")
        return proc

    def ensure_assignment(self) -> None:
        """Record the assignment, its notebooks and grade cells in the gradebook (idempotent)."""
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{self.db_path}", COURSE_ID) as gb:
            known = {a.name for a in gb.assignments}
        if self.assignment not in known or not self._release_matches_db():
            # generate_assignment records the notebooks and grade cells; its release goes into the course
            # folder, so that grading never rewrites the repository's notebooks/
            Course(self.root, self.cell_timeout, release=self.root / "release", source=self.source,
                   startup_timeout=self.startup_timeout, startup_retries=self.startup_retries,
                   exchange=self.exchange, assignment=self.assignment).generate_release()
        due = self.plan.due.get(self.assignment)
        if due:   # course.toml's due date: nbgrader marks later submissions late
            from nbgrader.utils import parse_utc
            with Gradebook(f"sqlite:///{self.db_path}", COURSE_ID) as gb:
                gb.update_or_create_assignment(self.assignment, duedate=parse_utc(due))

    def _release_matches_db(self) -> bool:
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{self.db_path}", COURSE_ID) as gb:
            names = {nb.name for nb in gb.find_assignment(self.assignment).notebooks}
        return names == {Path(e.notebook).stem for e in self.exercises}

    def generate_release(self) -> Path:
        """nbgrader generate_assignment: solutions/<assignment>/ -> notebooks/<assignment>/ (and the gradebook's
        record of it), opened by the assignment's index (grader/index.py)."""
        self.nbgrader("generate_assignment", self.assignment, "--force")
        write_index(self)
        return self.release / self.assignment

    def import_roster(self, path: Path) -> int:
        """Names and emails from a CSV (columns id, first_name, last_name, email) into the gradebook, with
        nbgrader's own `nbgrader db student import`. Collecting again later keeps them."""
        self.nbgrader("db", "student", "import", str(Path(path).resolve()))
        import csv
        with open(path, newline="") as f:
            return sum(1 for _ in csv.DictReader(f))

    def add_students(self, students: list[str]) -> None:
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{self.db_path}", COURSE_ID) as gb:
            for s in students:
                gb.update_or_create_student(s)


def hidden_points() -> dict[str, float]:
    """{qid: points of its hidden-test cell}, read from the source notebooks (their nbgrader metadata)."""
    points = {}
    for ex in EXERCISES.values():
        nb = json.loads((SOURCE / ex.assignment / ex.notebook).read_text())
        for cell in nb["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("grade_id") == ex.hidden_cell:
                points[ex.id] = float(meta["points"])
    return points
