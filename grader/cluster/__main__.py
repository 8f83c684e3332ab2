"""Cluster grading, step by step (slurm/grade.sh calls these; see slurm/README.md):

    python -m grader.cluster submit   [--course DIR] [--student S ...] [--run NAME] [resources] [--dry-run]
    python -m grader.cluster task     --course DIR --run NAME --list FILE --per-task K   (one array task)
    python -m grader.cluster merge    [--course DIR] [--run NAME] [--to grades.csv]
    python -m grader.cluster status   [--course DIR] [--run NAME]
    python -m grader.cluster resubmit [--course DIR] [--run NAME] [--student S ...] [resources] [--dry-run]

--run defaults to the course's latest run. Resources default to GRADE_* environment variables, else
to the #SBATCH lines of slurm/grade.sh: GRADE_PARTITION, GRADE_ACCOUNT, GRADE_TIME, GRADE_CPUS, GRADE_MEM,
GRADE_GPUS, GRADE_PER_TASK, GRADE_TASKS, GRADE_MAX_RUNNING, GRADE_SBATCH_ARGS (extra sbatch options).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from ..course import Course
from ..report import progress as course_progress
from . import merge as merging
from . import slurm
from .runs import Run, chunk, read_list
from .task import make_template, run_task


def _env_int(name):
    return int(os.environ[name]) if os.environ.get(name) else None


def resources(args) -> slurm.Resources:
    return slurm.Resources(partition=args.partition, account=args.account, time=args.time, cpus=args.cpus,
                           mem=args.mem, gpus=args.gpus, per_task=args.per_task, tasks=args.tasks,
                           max_running=args.max_running,
                           extra=shlex.split(os.environ.get("GRADE_SBATCH_ARGS", "")) + (args.sbatch_arg or []))


def print_submission(run: Run, sub: dict, dry_run: bool) -> None:
    if dry_run:
        print(f"would submit {sub['students']} student(s), {sub['per_task']} per task, in {sub['tasks']} array task(s):")
        print("  " + shlex.join(sub["array_cmd"]))
        print("  " + shlex.join(sub["merge_cmd"]))
        return
    print(f"run {run.name}: {sub['students']} student(s), {sub['per_task']} per task, in job array "
          f"{sub['array_job']} ({sub['tasks']} task(s)); merge job {sub['merge_job']} runs after it")
    print(f"  progress:  python -m grader.cluster status --course {run.course.root} --run {run.name}")
    print(f"  folder:    {run.root}")


def cmd_submit(course: Course, args) -> int:
    students = args.student or course.students()
    missing = [s for s in students if not course.submitted(s).is_dir()]
    if missing or not students:
        raise SystemExit(f"no submissions for {missing or 'anyone'} in {course.submitted()}: "
                         f"run `python -m grader --course {course.root} collect` first")
    if args.dry_run:
        run = Run(course, args.run or "DRY-RUN")
    else:
        run = Run.create(course, args.run)
        make_template(course, run.template_db)
    print_submission(run, slurm.submit(run, students, resources(args), dry_run=args.dry_run), args.dry_run)
    return 0


def cmd_task(course: Course, args) -> int:
    run = Run.open(course, args.run)
    index = args.index if args.index is not None else int(os.environ.get("SLURM_ARRAY_TASK_ID", "0"))
    students = chunk(read_list(args.list), index, args.per_task)
    scratch = args.scratch or os.environ.get("LAB_SCRATCH") or None
    return run_task(run, students, Path(scratch) if scratch else None)


def cmd_merge(course: Course, args) -> int:
    run = Run.open(course, args.run)
    result = merging.merge(run, live_jobs=slurm.queued_jobs())
    print(f"merged {len(result['merged'])} student(s) of run {run.name} into {course.db_path}")
    if result["skipped"]:
        print(f"  not graded, not merged: {' '.join(result['skipped'])}")
    if not args.no_export:
        merging.export(course, Path(args.to) if args.to else course.root / "grades.csv")
    return 0


def cmd_status(course: Course, args) -> int:
    run = Run.open(course, args.run)
    live = slurm.queued_jobs()
    states = run.progress(live)
    total = sum(len(v) for v in states.values())
    print(f"run {run.name}: {total} submissions: " + ", ".join(f"{len(v)} {k}" for k, v in states.items()))
    for s in states["failed"]:
        st = run.state(s) or {}
        error = st.get("error") if st.get("state") == "failed" else "its job left the queue while grading"
        task = st.get("array_task")
        log = f"; log {run.logs / f'task-{task}.out'}" if task else ""
        print(f"  failed: {s} (job {task or st.get('job')} on {st.get('host')}{log}): {error}")
    merged = course_progress(course, run.students())
    print(f"course {course.root}: {len(merged['graded'])} of {total} merged into the gradebook")
    if live is not None:
        queued = sorted(run.job_ids() & live)
        print(f"jobs of this run in the queue: {' '.join(queued) if queued else 'none'}")
    return 0


def to_resubmit(run: Run, live: set[str] | None) -> list[str]:
    """Failed students; and those never started, once none of the run's jobs is queued."""
    states = run.progress(live)
    idle = live is not None and not (run.job_ids() & live)
    return states["failed"] + (states["waiting"] if idle else [])


def cmd_resubmit(course: Course, args) -> int:
    run = Run.open(course, args.run)
    students = args.student or to_resubmit(run, slurm.queued_jobs())
    if not students:
        print(f"run {run.name}: nothing to resubmit (see `python -m grader.cluster status`)")
        return 0
    print(f"resubmitting {len(students)} student(s): {' '.join(students)}")
    print_submission(run, slurm.submit(run, students, resources(args), dry_run=args.dry_run), args.dry_run)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grader.cluster", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    base = argparse.ArgumentParser(add_help=False)
    base.add_argument("--course", default="course", help="course folder (default: ./course)")
    base.add_argument("--run", help="run name (default: a new one for submit, else the latest)")
    base.add_argument("--assignment", help="one assignment of the course (default: each of them, an array each)")
    res = argparse.ArgumentParser(add_help=False)
    g = res.add_argument_group("resources of each grading task (default: GRADE_* variables, else grade.sh's #SBATCH)")
    g.add_argument("--partition", default=os.environ.get("GRADE_PARTITION"))
    g.add_argument("--account", default=os.environ.get("GRADE_ACCOUNT"))
    g.add_argument("--time", default=os.environ.get("GRADE_TIME"), help="per task, e.g. 00:30:00")
    g.add_argument("--cpus", type=int, default=_env_int("GRADE_CPUS"), help="CPUs per task (the checks run 4 ranks)")
    g.add_argument("--mem", default=os.environ.get("GRADE_MEM"), help="memory per task, e.g. 8G")
    g.add_argument("--gpus", type=int, default=_env_int("GRADE_GPUS"),
                   help="GPUs per task (4: one per rank, the checks then use NCCL)")
    g.add_argument("--per-task", type=int, default=_env_int("GRADE_PER_TASK"), help="students per array task (1)")
    g.add_argument("--tasks", type=int, default=_env_int("GRADE_TASKS"), help="or: the number of array tasks")
    g.add_argument("--max-running", type=int, default=_env_int("GRADE_MAX_RUNNING"),
                   help="array tasks running at once (the %%N of --array)")
    g.add_argument("--sbatch-arg", action="append", help="another sbatch option (repeatable)")
    g.add_argument("--dry-run", action="store_true", help="print the sbatch commands, submit nothing")

    p = sub.add_parser("submit", parents=[base, res], help="grade the course's submissions as a job array")
    p.add_argument("--student", nargs="+")
    p = sub.add_parser("task", parents=[base], help="one array task (run by Slurm)")
    p.add_argument("--list", type=Path, required=True)
    p.add_argument("--per-task", type=int, default=1)
    p.add_argument("--index", type=int, help="array index (default: $SLURM_ARRAY_TASK_ID)")
    p.add_argument("--scratch", help="node-local folder for task spaces (default: $LAB_SCRATCH, $TMPDIR, /tmp)")
    p = sub.add_parser("merge", parents=[base], help="merge graded task spaces into the course, export CSV")
    p.add_argument("--to", help="grades CSV (default: <course>/grades.csv)")
    p.add_argument("--no-export", action="store_true")
    sub.add_parser("status", parents=[base], help="graded / running / failed / waiting")
    p = sub.add_parser("resubmit", parents=[base, res], help="submit the failed students again")
    p.add_argument("--student", nargs="+", help="these students instead of the failed ones")
    args = ap.parse_args(argv)
    command = {"submit": cmd_submit, "task": cmd_task, "merge": cmd_merge, "status": cmd_status,
               "resubmit": cmd_resubmit}[args.command]
    courses = Course(args.course).each(args.assignment)
    if args.command == "submit" and len(courses) > 1 and not args.student:
        courses = [c for c in courses if c.students()]   # an assignment nobody returned yet: nothing to grade
    codes = []
    for course in courses:
        if len(courses) > 1:
            print(f"--- {course.assignment}")
        try:
            codes.append(command(course, args))
        except SystemExit as e:   # one assignment without runs or submissions: say so, go on with the others
            if len(courses) == 1:
                raise
            print(e)
            codes.append(1)
    return max(codes or [0])


if __name__ == "__main__":
    sys.exit(main())
