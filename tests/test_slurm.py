"""Cluster grading (grader.cluster, slurm/grade.sh).

Fast tests build tiny gradebooks with nbgrader's API and check the merge (idempotent, keeps what
graders entered), the run's bookkeeping and the sbatch command lines. The slow test starts a private
single-node Slurm (munged, slurmctld, slurmd on free ports, everything in a temporary folder), grades
three students of the sample cohort with `sbatch slurm/grade.sh`, cancels one array task mid-run,
resubmits it, and compares the merged gradebook with the local autograde of the same students
(conftest.graded_cohort, which the cohort tests use too).
"""
from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from grader.cluster import merge as merging
from grader.cluster.__main__ import to_resubmit
from grader.cluster.runs import Run, chunk
from grader.cluster.slurm import Resources, plan
from grader.cluster.task import make_template, run_task
from grader.course import COURSE_ID, Course
from grader.report import grade_rows
from lab_src.registry import ASSIGNMENT, EXERCISES, MODULES

CODED = [EXERCISES[q] for q in MODULES[ASSIGNMENT] if EXERCISES[q].function]   # tiny_course's

# nbgrader's own add_submission trips SQLAlchemy's autoflush warnings
pytestmark = pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")

ROOT = Path(__file__).resolve().parent.parent
GRADE_SH = ROOT / "slurm" / "grade.sh"


# ---- gradebook helpers ---------------------------------------------------------------------------
def snapshot(course: Course, students=None) -> dict:
    """... of the assignment `course` acts on."""
    """Everything autograding and merging write, per student, in comparable form."""
    from nbgrader.api import Gradebook, MissingEntry
    out = {}
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        ids = sorted(s.id for s in gb.students)
        for s in students or ids:
            try:
                sub = gb.find_submission(course.assignment, s)
            except MissingEntry:
                out[s] = None
                continue
            out[s] = {"timestamp": str(sub.timestamp), "notebooks": {
                nb.name: {"penalty": nb.late_submission_penalty,
                          "grades": {g.name: (g.auto_score, g.manual_score, g.extra_credit, g.needs_manual_grade)
                                     for g in nb.grades},
                          "comments": {c.name: (c.auto_comment, c.manual_comment) for c in nb.comments}}
                for nb in sub.notebooks}}
        out["_students"] = [s for s in ids if students is None or s in students]
    return out


def tiny_course(root: Path) -> Course:
    """A course whose gradebook knows the assignment (every notebook, a hidden-test cell per coded
    exercise and a written answer per notebook) without running nbgrader."""
    from nbgrader.api import Gradebook
    course = Course(root)
    course.root.mkdir(parents=True)
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:
        gb.add_assignment(ASSIGNMENT)
        for ex in course.exercises:      # the core assignment's
            nb = Path(ex.notebook).stem
            gb.add_notebook(nb, ASSIGNMENT)
            if ex.function:
                gb.add_grade_cell(ex.hidden_cell, nb, ASSIGNMENT, max_score=5.0, cell_type="code")
            gb.add_grade_cell(f"{ex.id}_written", nb, ASSIGNMENT, max_score=2.0, cell_type="markdown")
            gb.add_solution_cell(f"{ex.id}_written", nb, ASSIGNMENT)
    return course


def fake_graded_space(run: Run, student: str, scores: dict[str, float], job: str = "1") -> None:
    """What a task publishes for a graded student, without grading anyone."""
    from nbgrader.api import Gradebook
    space = run.space(student)
    space.root.mkdir(parents=True, exist_ok=True)
    shutil.copy(run.template_db, space.db_path)
    with Gradebook(f"sqlite:///{space.db_path}", COURSE_ID) as gb:
        gb.add_student(student)
        sub = gb.update_or_create_submission(ASSIGNMENT, student, timestamp="2026-01-02 03:04:05")
        for nb in sub.notebooks:
            for g in nb.grades:
                hidden = g.name.endswith("_hidden")
                g.auto_score = scores.get(g.name[:3], 0.0) if hidden else None
                g.needs_manual_grade = not hidden
            for c in nb.comments:
                c.auto_comment = None if scores else "No response."
        gb.db.commit()
    nb_dir = space.autograded(student)
    nb_dir.mkdir(parents=True, exist_ok=True)
    (nb_dir / "q02_check_args.ipynb").write_text(json.dumps({"scores": scores}))
    (space.root / "grader" / student).mkdir(parents=True, exist_ok=True)
    (space.root / "grader" / student / "status.json").write_text(json.dumps({"state": "graded"}))
    run.write_state(student, "graded", job=job)


@pytest.fixture(scope="module")
def tiny_gradebook(tmp_path_factory) -> Path:
    return tiny_course(tmp_path_factory.mktemp("tiny") / "course").db_path


@pytest.fixture
def tiny_run(tmp_path, tiny_gradebook):
    course = Course(tmp_path / "course")
    course.root.mkdir()
    shutil.copy(tiny_gradebook, course.db_path)
    run = Run.create(course, "r1")
    make_template(course, run.template_db)
    return run


# ---- fast tests -----------------------------------------------------------------------------------
def test_template_has_the_assignment_and_no_students(tiny_run):
    from nbgrader.api import Gradebook
    fake_graded_space(tiny_run, "ada", {"q02": 5.0})
    merging.merge(tiny_run)
    make_template(tiny_run.course, tiny_run.root / "again.db")  # from a course that now has a student
    with Gradebook(f"sqlite:///{tiny_run.root / 'again.db'}", COURSE_ID) as gb:
        assert [s.id for s in gb.students] == []
        assert len(gb.find_assignment(ASSIGNMENT).notebooks) == len(MODULES[ASSIGNMENT])


def test_merge_copies_the_grades_and_is_idempotent(tiny_run):
    run, course = tiny_run, tiny_run.course
    run.add_list(["ada", "bo", "cy"])
    fake_graded_space(run, "ada", {ex.id: 5.0 for ex in CODED})
    fake_graded_space(run, "bo", {"q08": 1.67})
    run.write_state("cy", "failed", error="boom", job="3")

    assert merging.merge(run) == {"merged": ["ada", "bo"], "skipped": ["cy"]}
    first = snapshot(course)
    assert first["_students"] == ["ada", "bo"]
    rows = {r["student"]: r for r in grade_rows(course)}
    assert rows["ada"]["autograded"] == 5.0 * len(CODED) and rows["bo"]["autograded"] == 1.67 and rows["bo"]["q08"] == 1.67
    assert rows["ada"]["written_pending"] == len(MODULES[ASSIGNMENT])     # a written answer per notebook (tiny_course)
    assert first["ada"] == snapshot(run.space("ada"))["ada"]  # exactly what the task space holds
    assert json.loads((course.autograded("bo") / "q02_check_args.ipynb").read_text()) == {"scores": {"q08": 1.67}}
    assert json.loads((course.root / "grader" / "bo" / "status.json").read_text())["state"] == "graded"

    merging.merge(run)
    assert snapshot(course) == first


def test_merge_keeps_manual_grades_and_takes_a_regrade(tiny_run):
    from nbgrader.api import Gradebook
    run, course = tiny_run, tiny_run.course
    run.add_list(["ada", "bo"])
    fake_graded_space(run, "ada", {"q02": 5.0})
    fake_graded_space(run, "bo", {"q02": 1.0})
    merging.merge(run)
    with Gradebook(f"sqlite:///{course.db_path}", COURSE_ID) as gb:  # a grader at work in the formgrader
        gb.find_grade("q01_written", "q01_seeds", ASSIGNMENT, "ada").manual_score = 1.5
        gb.find_grade("q02_hidden", "q02_check_args", ASSIGNMENT, "ada").manual_score = 4.0
        gb.find_comment("q01_written", "q01_seeds", ASSIGNMENT, "ada").manual_comment = "good"
        gb.db.commit()
    fake_graded_space(run, "bo", {"q02": 3.0}, job="2")  # bo graded again, with a better answer

    merging.merge(run)
    after = snapshot(course)
    q01, q02 = after["ada"]["notebooks"]["q01_seeds"], after["ada"]["notebooks"]["q02_check_args"]
    assert q01["grades"]["q01_written"] == (None, 1.5, None, True)
    assert q01["comments"]["q01_written"] == (None, "good")
    assert q02["grades"]["q02_hidden"] == (5.0, 4.0, None, False)
    assert after["bo"]["notebooks"]["q02_check_args"]["grades"]["q02_hidden"][0] == 3.0
    merging.merge(run)
    assert snapshot(course) == after


def test_progress_lost_tasks_and_what_to_resubmit(tiny_run):
    run = tiny_run
    run.add_list(["ada", "bo", "cy", "dan", "eve"])
    run.record_submission(array_job="70", merge_job="71")
    run.write_state("ada", "graded", job="72")
    run.write_state("bo", "running", job="73")   # its node died: no longer queued
    run.write_state("cy", "running", job="74")   # still running
    run.write_state("dan", "failed", job="75", error="terminated by SIGTERM")
    live = {"70", "71", "74"}
    assert run.progress(live) == {"graded": ["ada"], "running": ["cy"], "failed": ["bo", "dan"], "waiting": ["eve"]}
    assert run.progress(None)["running"] == ["bo", "cy"]     # without squeue nothing is known to be lost
    assert to_resubmit(run, live) == ["bo", "dan"]          # eve may still be pending in array 70
    assert to_resubmit(run, set()) == ["bo", "cy", "dan", "eve"]

    merging.merge(run, live_jobs=live)  # records the lost task
    assert run.state("bo")["state"] == "failed" and "without a result" in run.state("bo")["error"]
    assert run.state("cy")["state"] == "running"


def test_sbatch_command_lines(tiny_run):
    res = Resources(partition="gpu", cpus=4, mem="8G", gpus=4, time="01:00:00", per_task=2, max_running=3,
                    extra=["--qos=short"])
    p = plan(tiny_run, tiny_run.root / "lists" / "000.txt", 5, res)
    array, merge = p["array_cmd"], p["merge_cmd"]
    assert (p["per_task"], p["tasks"]) == (2, 3)
    for flag in ("--array=0-2%3", "--gres=gpu:4", "--cpus-per-task=4", "--mem=8G", "--time=01:00:00",
                 "--partition=gpu", "--qos=short", "--export=ALL"):
        assert flag in array
    assert array[array.index(str(GRADE_SH)) + 1:][:1] == ["task"] and array[-2:] == ["--per-task", "2"]
    assert "--dependency=afterany:{array}" in merge and "--partition=gpu" in merge
    assert not any(a.startswith("--gres") for a in merge)
    assert merge[merge.index(str(GRADE_SH)) + 1] == "merge"
    # Slurm's array indices stop at 1000: more students than that go several to a task
    assert Resources().students_per_task(2500) == 3 and Resources(tasks=10).students_per_task(95) == 10
    assert chunk(["a", "b", "c", "d", "e"], 2, 2) == ["e"] and chunk(["a"], 1, 1) == []


def test_a_task_records_a_failed_student_and_goes_on(tiny_run, monkeypatch):
    run = tiny_run
    run.add_list(["ghost"])  # no submission: grading it fails at once
    before = signal.getsignal(signal.SIGTERM)
    assert run_task(run, ["ghost"]) == 1
    assert signal.getsignal(signal.SIGTERM) == before
    state = run.state("ghost")
    assert state["state"] == "failed" and "FileNotFoundError" in state["error"]
    assert merging.merge(run)["skipped"] == ["ghost"]


def test_grade_sh_finds_the_environment_and_plans(tiny_run, tmp_path):
    course = tiny_run.course
    for s in ("ada", "bo", "cy"):
        course.submitted(s).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LAB_PYTHON", "LAB_ROOT")}
    env.update(GRADE_CPUS="2", GRADE_MAX_RUNNING="1")
    proc = subprocess.run([str(GRADE_SH), "--course", str(course.root), "--dry-run", "--per-task", "2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "would submit 3 student(s), 2 per task, in 2 array task(s)" in proc.stdout
    assert "--array=0-1%1" in proc.stdout and "--cpus-per-task=2" in proc.stdout
    assert not (course.root / "cluster" / "DRY-RUN").exists()


# ---- a private single-node Slurm --------------------------------------------------------------------
SLURM_PACKAGES = {"slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client", "munged": "munge"}
SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE"}


def ensure_slurm_installed() -> None:
    """Debian's Slurm and munge, installed as scripts/system_deps.sh does when missing; else skip."""
    missing = [pkg for cmd, pkg in SLURM_PACKAGES.items() if not shutil.which(cmd, path=SBIN_PATH)]
    if not missing:
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"Slurm is not installed ({' '.join(missing)}) and cannot be without root and apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, timeout=300, check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env,
                       capture_output=True, timeout=600, check=True)
    except (subprocess.SubprocessError, OSError) as e:
        pytest.skip(f"could not install Slurm ({' '.join(missing)}): {e}")


def cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def still_running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class PrivateSlurm:
    """munged + slurmctld + slurmd of our own, on free ports, with every file in `root`.

    The daemons run in the foreground as our children, so stopping them never touches another Slurm
    or munge on the machine; processes of our jobs are found by the SLURM_CONF in their environment."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.sock"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf), "PATH": SBIN_PATH}
        self.daemons: dict[str, subprocess.Popen] = {}

    def _daemon(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "w")
        self.daemons[name] = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def start(self) -> None:
        self.root.chmod(0o755)  # munged wants its socket's folders searchable by all
        (self.root / "munge").mkdir(mode=0o755)
        for sub in ("state", "spool"):
            (self.root / sub).mkdir()
        key = self.root / "munge" / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], env=self.env, check=True, capture_output=True, timeout=30)
        self._daemon("munged", ["munged", "-F", "-S", str(self.socket), f"--key-file={key}",
                                f"--log-file={self.root / 'munge' / 'munged.log'}",
                                f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                                f"--seed-file={self.root / 'munge' / 'munged.seed'}"])
        wait_for(self.socket.exists, 20, "munged's socket", every=0.2)
        memory = int(psutil.virtual_memory().total / 2**20 * 0.8)
        r = self.root
        self.conf.write_text(f"""\
ClusterName=pplabtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={self.socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=900
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
        self._daemon("slurmctld", ["slurmctld", "-D", "-i"])
        self._daemon("slurmd", ["slurmd", "-D", "-N", "localhost"])
        wait_for(lambda: self.cmd("sinfo", "-h", "-o", "%T", check=False).stdout.strip() == "idle", 60,
                 "the node to be idle")

    def cmd(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc

    def job_states(self, job: str) -> list[str]:
        """JobState of each job a `scontrol show job` of `job` lists (an array: every task)."""
        out = self.cmd("scontrol", "show", "job", job, check=False).stdout
        return re.findall(r"JobState=(\w+)", out)

    def wait_job(self, job: str, timeout: float) -> list[str]:
        """Poll scontrol until `job` (every task of it) has ended; its final states."""
        return wait_for(lambda: (s := self.job_states(job)) and set(s) <= TERMINAL and s, timeout, f"job {job} to end",
                        every=2)

    def our_processes(self, job: str | None = None) -> list[psutil.Process]:
        """Processes with our SLURM_CONF in their environment (and SLURM_JOB_ID=`job`), daemons aside,
        and their descendants: the grading sandbox clears the environment of what it starts."""
        daemons = {p.pid for p in self.daemons.values()}
        found: dict[int, psutil.Process] = {}
        for p in psutil.process_iter():
            try:
                env = p.environ()
            except (psutil.Error, OSError):
                continue
            if p.pid not in daemons and env.get("SLURM_CONF") == str(self.conf) \
                    and (job is None or env.get("SLURM_JOB_ID") == job):
                found[p.pid] = p
                try:
                    found.update((c.pid, c) for c in p.children(recursive=True))
                except psutil.Error:
                    pass
        return list(found.values())

    def stop(self) -> None:
        """Cancel our jobs, stop our daemons, and end whatever our jobs left running."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            self.cmd("scancel", "-u", getpass.getuser(), check=False, timeout=30)
            try:
                wait_for(lambda: not self.cmd("squeue", "-h", check=False).stdout.strip(), 30, "the queue to empty")
            except (AssertionError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
            if name == "slurmctld":
                left = self.our_processes()
                for p in left:
                    p.kill()
                psutil.wait_procs(left, timeout=10)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    ensure_slurm_installed()
    # Not under pytest's base folder: munged wants every folder above its socket searchable by all.
    cluster = PrivateSlurm(Path(tempfile.mkdtemp(prefix="pp-lab-slurm-")))
    try:
        try:
            cluster.start()
        except (AssertionError, OSError, subprocess.SubprocessError) as e:
            logs = "".join(p.read_text()[-1500:] for p in sorted(cluster.root.rglob("*.log")))
            pytest.skip(f"could not start a private Slurm: {e}\n{logs}")
        yield cluster
    finally:
        cluster.stop()
        keep = tmp_path_factory.mktemp("slurm-logs")
        for log in [*cluster.root.rglob("*.log"), *cluster.root.glob("*.out")]:
            shutil.copy(log, keep / log.name)
        shutil.rmtree(cluster.root, ignore_errors=True)
    alive = [n for n, p in cluster.daemons.items() if p.poll() is None]
    assert not alive and not cluster.our_processes(), f"left behind: {alive} {cluster.our_processes()}"


# ---- the end-to-end test ----------------------------------------------------------------------------
STUDENTS = ["ada", "ivo", "untouched"]   # full marks, a partial q08 (ivo returns the core alone), nothing answered
# the cluster's course hands out two assignments (course.toml): grade.sh submits an array for each
TWO = ["pipeline_lab", "pipeline_training"]


def grader_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "grader", *args]


@pytest.mark.slow
@pytest.mark.uses_cohort_late    # it grades while the cohort grades in the background, then compares
@pytest.mark.timeout(3600)   # run alone, the graded cohort it compares with is graded first (every assignment)
def test_grade_sh_on_a_real_slurm(slurm, request, tmp_path):
    from grader.cohort import BY_NAME, build_student
    from grader.report import progress
    started = time.monotonic()
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_"))}
    for s in STUDENTS:
        build_student(BY_NAME[s], tmp_path / "cohort")
    cluster_course = tmp_path / "cluster-course"
    from grader import plan
    plan.write(cluster_course, TWO)
    subprocess.run(grader_cmd("--course", str(cluster_course), "collect", "--from", str(tmp_path / "cohort")),
                   cwd=ROOT, env=base_env, check=True, capture_output=True, timeout=300)
    slurm.env["LAB_PYTHON"] = sys.executable
    planner = slurm.cmd("sbatch", "--parsable", "--cpus-per-task=1", "--mem=1G", f"--chdir={tmp_path}",
                        str(GRADE_SH), "--course", str(cluster_course), "--run", "r1",
                        "--cpus", "1", "--mem", "2G", "--max-running", "1").stdout.strip()
    assert slurm.wait_job(planner, 180) == ["COMPLETED"], (tmp_path / f"pp-lab-grade-{planner}.out").read_text()
    run = Run.open(Course(cluster_course), "r1")
    first = run.meta()["submissions"][0]
    assert first["tasks"] == 3 and "--array=0-2%1" in first["array_cmd"]
    later = Run.open(Course(cluster_course, assignment=TWO[1]), "r1")      # the second assignment's array
    assert later.meta()["submissions"][0]["tasks"] == 2 and later.root != run.root     # ada and untouched

    # Cancel the first array task while it grades ada; the others go on.
    wait_for(lambda: (run.state("ada") or {}).get("state") == "running", 180, "ada's task to start")
    ada_job = run.state("ada")["job"]
    # the hidden tests run in a sandbox whose fork server (lab_src.harness.zygote) forks the ranks
    wait_for(lambda: any("lab_src.harness.zygote" in cmdline(p) for p in slurm.our_processes(ada_job)),
             120, "ada's hidden tests to start their sandbox", every=0.5)
    tree = slurm.our_processes(ada_job)          # the task, its sandbox, the fork server and the ranks
    slurm.cmd("scancel", f"{first['array_job']}_0")
    assert slurm.wait_job(f"{first['array_job']}_0", 60) == ["CANCELLED"]
    wait_for(lambda: not slurm.our_processes(job=ada_job) and not [p for p in tree if still_running(p)], 20,
             "the cancelled task's processes (sandboxed ones included) to end")
    assert run.state("ada")["state"] == "failed" and "SIGTERM" in run.state("ada")["error"]
    assert slurm.wait_job(first["merge_job"], 600) == ["COMPLETED"]
    assert sorted(slurm.job_states(first["array_job"])) == ["CANCELLED", "COMPLETED", "COMPLETED"]
    status = slurm.cmd(str(GRADE_SH), "status", "--course", str(cluster_course)).stdout
    assert "3 submissions: 2 graded, 0 running, 1 failed, 0 waiting" in status, status
    assert "2 of 3 merged" in status
    assert progress(Course(cluster_course), STUDENTS)["graded"] == ["ivo", "untouched"]

    # Resubmit just the failed student; the new merge completes the course.
    out = slurm.cmd(str(GRADE_SH), "resubmit", "--course", str(cluster_course),
                    "--cpus", "1", "--mem", "2G").stdout
    assert "resubmitting 1 student(s): ada" in out, out
    second = run.meta()["submissions"][1]
    assert second["students"] == 1
    assert slurm.wait_job(second["merge_job"], 400) == ["COMPLETED"]
    assert slurm.job_states(second["array_job"]) == ["COMPLETED"]
    status = slurm.cmd(str(GRADE_SH), "status", "--course", str(cluster_course)).stdout
    assert "3 graded, 0 running, 0 failed, 0 waiting" in status and "3 of 3 merged" in status, status
    assert slurm.wait_job(later.meta()["submissions"][0]["merge_job"], 600) == ["COMPLETED"]
    status = slurm.cmd(str(GRADE_SH), "status", "--course", str(cluster_course), "--assignment", TWO[1]).stdout
    assert "2 graded, 0 running, 0 failed, 0 waiting" in status and "2 of 2 merged" in status, status

    graded_cohort = request.getfixturevalue("graded_cohort")
    for assignment in TWO:   # the same submissions, graded locally (the default course: every assignment)
        merged = Course(cluster_course, assignment=assignment)
        graded_here = graded_cohort[0].for_assignment(assignment)
        assert snapshot(merged, STUDENTS) == snapshot(graded_here, STUDENTS)
        rows = {r["student"]: r for r in grade_rows(merged)}
        assert rows == {r["student"]: r for r in grade_rows(graded_here) if r["student"] in STUDENTS}
        assert rows["ada"]["autograded"] == rows["ada"]["autograded_max"] > 0 and rows["untouched"]["autograded"] == 0
        for s in STUDENTS:
            assert sorted(p.name for p in merged.autograded(s).glob("*.ipynb")) == \
                sorted(p.name for p in graded_here.autograded(s).glob("*.ipynb"))
    merged = Course(cluster_course)
    rows = {r["student"]: r for r in grade_rows(merged)}
    assert 0 < rows["ivo"]["autograded"] < rows["ivo"]["autograded_max"]
    # nbgrader's export: a row per student and assignment
    assert (cluster_course / "grades.csv").read_text().count("\n") == 1 + len(STUDENTS) * len(TWO)

    # Merging again changes nothing.
    before = snapshot(merged)
    assert merging.merge(run)["merged"] == sorted(STUDENTS)
    assert snapshot(merged) == before
    print(f"end-to-end: {time.monotonic() - started:.0f} s")
