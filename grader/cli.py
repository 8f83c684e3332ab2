"""Instructor commands, one line each (run from the repository, with .venv/bin/python or the venv active):

    python -m grader release                          # solutions/<A>/ -> notebooks/<A>/ (nbgrader generate_assignment)
    python -m grader release --exchange [DIR]         # ... then into nbgrader's exchange (release_assignment)
    python -m grader collect --exchange [DIR]         # each student's latest submission from nbgrader's exchange
    python -m grader collect --from DIR               # DIR/<student>/*.ipynb -> course/submitted/
    python -m grader collect --zip A.zip [B.zip ...]  # archives of <student>/*.ipynb, via nbgrader zip_collect
    python -m grader autograde [--student S ...] [--jobs N]
    python -m grader feedback [--student S ...]       # course/feedback/<student>/<A>/*.html
    python -m grader feedback --release               # ... then into the exchange (nbgrader release_feedback)
                                                      # (fails, naming them, if a student has none)
    python -m grader export [--to grades.csv]         # nbgrader's grades.csv and per-exercise grades
    python -m grader roster names.csv                 # students' names (id,first_name,last_name,email)
    python -m grader status                           # graded / running / failed / waiting
    python -m grader table                            # the grade table
    python -m grader text [--from-py]                 # solutions/*.ipynb <-> their jupytext .py twins
    python -m grader new qNN function_name            # the skeleton of a new exercise (--schedule NAME: a step;
                                                      # --module M --module-title "...": in a new module M)
    python -m grader readme                           # README's exercise table, from the registry

`--course DIR` (default ./course) chooses the course folder: gradebook.db (SQLite), submissions,
autograded notebooks and feedback; its course.toml (grader/plan.py) the modules it hands out, each an nbgrader
assignment. `--assignment A` after release, collect, autograde, feedback, export, status or table acts on
assignment A only (default: every assignment of the course, in course order). Checks run on the CPU with gloo unless every rank has a GPU.
`--exchange` without DIR uses nbgrader's configured `Exchange.root` (grader/exchange.py).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import zipfile
from pathlib import Path

from lab_src.registry import EXERCISES, MODULES

from .autograde import DEFAULT_JOBS
from .course import Course


def cmd_release(course: Course, args) -> int:
    if args.exchange is not None:
        from . import exchange
        print(exchange.release(course, args.exchange or None).strip())
        print(f"{course.assignment} released into nbgrader's exchange")
        return 0
    path = course.generate_release()
    print(f"release written to {path}")
    return 0


def collect_folder(course: Course, src: Path) -> list[str]:
    """Copy SRC/<student>/<assignment>/, or SRC/<student>/ when its top holds notebooks of the assignment
    (less the other assignments' notebooks), into the course's assignment. A student with neither has not
    returned this assignment."""
    students = []
    others = {e.notebook for e in EXERCISES.values()} - {e.notebook for e in course.exercises}
    mine = {e.notebook for e in course.exercises}
    for folder in sorted(p for p in Path(src).iterdir() if p.is_dir()):
        inner = folder / course.assignment
        if not inner.is_dir():
            if not any((folder / n).exists() for n in mine):
                continue
            inner = folder
        dest = course.submitted(folder.name)
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(inner, dest, symlinks=False,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", *others, *MODULES))
        students.append(folder.name)
    return students


def cmd_collect(course: Course, args) -> int:
    if args.exchange is not None:
        from . import exchange
        students = exchange.collect(course, args.exchange or None)
        print(f"collected {len(students)} submissions into {course.submitted()}")
        return 0
    if args.source:
        students = collect_folder(course, args.source)
    else:
        archive = course.root / "downloaded" / course.assignment / "archive"
        archive.mkdir(parents=True, exist_ok=True)
        for z in args.zip:
            if not zipfile.is_zipfile(z):
                raise SystemExit(f"{z} is not a zip archive")
            shutil.copy(z, archive / Path(z).name)
        course.nbgrader("zip_collect", course.assignment, "--force")
        students = course.students()
    course.ensure_assignment()
    course.add_students(students)
    if args.roster:
        course.import_roster(args.roster)
    print(f"{course.assignment}: collected {len(students)} submissions into {course.submitted()}")
    return 0


def returned(course: Course, args) -> list[str]:
    """The students a command acts on in this assignment: `--student` (those of them who returned it, when
    the command runs over every assignment), else everybody who returned it."""
    if not args.student:
        return course.students()
    return args.student if args.assignment else [s for s in args.student if course.submitted(s).is_dir()]


def cmd_autograde(course: Course, args) -> int:
    """Every assignment of the course (or --assignment), each student's returned assignments graded
    together (grader/autograde.py grade_course), then a table per assignment."""
    from .autograde import grade_course
    from .report import format_table, grade_rows
    if not args.unsafe_no_sandbox:
        from lab_src.harness import sandbox
        if not sandbox.available():     # said once, before any work: each one's grading would fail on it
            print(f"cannot autograde here: {sandbox.describe_unavailable()}. (--unsafe-no-sandbox grades without "
                  f"it: students' code then runs as you, beside the reference answers.)", file=sys.stderr)
            return 2
    parts = course.each(args.assignment)
    students = sorted({s for p in parts for s in returned(p, args)})
    if not students:
        for p in parts:
            print(f"{p.assignment}: no submissions in {p.submitted()} (run `python -m grader collect` first)")
        return 1 if args.assignment else 0      # a later assignment nobody returned yet is no error

    def done(student, out):
        if out["state"] == "graded":
            print(f"  {student:<12} {out['assignment']}: graded in {out['wall_s']:.0f} s ({out['cases']} cases, "
                  f"{out['launches']} torchrun launch{'es' if out['launches'] != 1 else ''})", flush=True)
        else:
            print(f"  {student:<12} {out['assignment']}: FAILED: {out['error'][:300]}", flush=True)

    print(f"{', '.join(p.assignment for p in parts)}: autograding {len(students)} student(s), {args.jobs} at a "
          f"time ...", flush=True)
    if args.unsafe_no_sandbox:
        print("WARNING: grading without a sandbox: students' code runs as you, beside the reference answers; "
              "every report will say so.", flush=True)
    results = grade_course(course, students, jobs=args.jobs, on_done=done, unsafe_no_sandbox=args.unsafe_no_sandbox,
                           assignment=args.assignment)
    for p in parts:
        print(f"\n{p.assignment}:")
        print(format_table(grade_rows(p), [e.id for e in p.exercises if e.function]))
    return 1 if any(r["state"] != "graded" for r in results.values()) else 0


def cmd_feedback(course: Course, args) -> int:
    from .feedback import generate_feedback
    students = returned(course, args)
    if not students:
        print(f"{course.assignment}: no submissions to give feedback on")
        return 1 if args.assignment else 0
    missing = generate_feedback(course, students if args.student else None)
    print(f"{course.assignment}: feedback written under {course.root / 'feedback'} for {len(students) - len(missing)} of "
          f"{len(students)} submissions")
    for student, why in sorted(missing.items()):
        print(f"  NO FEEDBACK for {student}: {why}")
    print(ungraded_note(course, students))
    if args.release:
        from . import exchange
        exchange.release_feedback(course, args.exchange or None)
        print("feedback released into nbgrader's exchange: students fetch it in the Assignments panel")
    return 1 if missing else 0


def ungraded_note(course: Course, students: list[str]) -> str:
    """What the instructor must know before handing feedback out: written answers not graded by hand yet show
    in it as 0 of their points, like a wrong answer ("" when there are none)."""
    from .report import grade_rows
    pending = {r["student"]: r["written_pending"] for r in grade_rows(course)
               if r["student"] in students and r.get("written_pending")}
    if not pending:
        return f"{course.assignment}: no written answer of these submissions waits for a grade"
    names = ", ".join(f"{s} {n}" for s, n in sorted(pending.items())[:8]) + (" ..." if len(pending) > 8 else "")
    return (f"NOTE: {sum(pending.values())} written answers of {len(pending)} of these submissions are not graded "
            f"yet ({names}): their feedback shows each as 0 of its points, as if it were wrong. Grade them in "
            f"formgrader (Manual Grading), then run `python -m grader feedback` again before handing it out")


def cmd_export(course: Course, args) -> int:
    from .report import export_csv
    course.nbgrader("export", "--to", str(Path(args.to).resolve()))   # a row per student and assignment
    detail = Path(args.to).with_name(Path(args.to).stem + "_by_exercise.csv")
    export_csv(course, detail, args.assignment)
    print(f"grades written to {args.to} (nbgrader) and {detail} (per exercise)")
    return 0


def cmd_status(course: Course, args) -> int:
    from .formgrader_view import status_of
    from .report import progress
    states = progress(course)
    total = sum(len(v) for v in states.values())
    print(f"{course.assignment}: {total} submissions: " + ", ".join(f"{len(v)} {k}" for k, v in states.items()))
    for s in states.get("failed", []):
        print(f"  failed: {s}: {status_of(course, s).get('error', '')[:500]}")
    return 0


def cmd_roster(course: Course, args) -> int:
    n = course.import_roster(args.csv)
    print(f"{n} students' names imported into {course.db_path} (nbgrader db student import)")
    return 0


def cmd_text(course: Course, args) -> int:
    from .notebook_text import write_notebooks, write_text
    written = write_notebooks() if args.from_py else write_text()
    print("\n".join(f"wrote {p}" for p in written) or "every notebook and its .py twin already agree")
    return 0


def cmd_new(course: Course, args) -> int:
    from .new_exercise import create
    for path in create(args.qid, args.function, args.title, args.points, args.schedule, args.needs, args.module,
                       args.topic, args.module_title):
        print(f"wrote {path}")
    print("Now write the prose, the reference answer, the check and the hidden tests; add realistic mistakes "
          "to grader/cohort/mistakes.py and students.py; then `python -m grader text` and `python -m grader release`.")
    return 0


def cmd_readme(course: Course, args) -> int:
    from .readme import update
    print("README.md's exercise table rewritten" if update() else "README.md's exercise table is up to date")
    return 0


def cmd_table(course: Course, args) -> int:
    from .report import course_rows, format_table
    print(format_table(course_rows(course, args.assignment)))
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m grader", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--course", default="course", help="course folder (default: ./course)")
    sub = ap.add_subparsers(dest="command", required=True)
    one = argparse.ArgumentParser(add_help=False)
    one.add_argument("--assignment", metavar="A", help="this assignment only (default: every one of the course)")
    p = sub.add_parser("release", parents=[one], help="generate notebooks/ from solutions/")
    p.add_argument("--exchange", nargs="?", const="", metavar="DIR", help="then release it into nbgrader's exchange")
    p = sub.add_parser("collect", parents=[one], help="file returned notebooks into the course")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--from", dest="source", type=Path, help="folder of <student>/ folders")
    g.add_argument("--zip", nargs="+", type=Path, help="zip archives of <student>/*.ipynb")
    g.add_argument("--exchange", nargs="?", const="", metavar="DIR", help="the latest submissions in nbgrader's exchange")
    p.add_argument("--roster", type=Path, help="also import names from this CSV (as `grader roster`)")
    p = sub.add_parser("autograde", parents=[one], help="grade submissions (nbgrader + out-of-process hidden tests)")
    p.add_argument("--student", nargs="+")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS,
                   help=f"students graded at once (default {DEFAULT_JOBS}: one per core, at most 4)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="grade without bubblewrap where none is available (every report says so)")
    p = sub.add_parser("feedback", parents=[one], help="HTML feedback for students")
    p.add_argument("--student", nargs="+")
    p.add_argument("--release", action="store_true", help="then release it into nbgrader's exchange")
    p.add_argument("--exchange", metavar="DIR", help="with --release: the exchange folder")
    p = sub.add_parser("export", parents=[one], help="grades as CSV")
    p.add_argument("--to", default="grades.csv")
    sub.add_parser("status", parents=[one], help="how many submissions are graded, running, failed")
    p = sub.add_parser("roster", help="names and emails from a CSV (id,first_name,last_name,email) into the gradebook")
    p.add_argument("csv", type=Path)
    sub.add_parser("table", parents=[one], help="print the grade table")
    p = sub.add_parser("text", help="write the .py twins of the source notebooks (or, --from-py, the reverse)")
    p.add_argument("--from-py", action="store_true", help="rebuild the notebooks from their edited .py twins")
    sub.add_parser("readme", help="rewrite README.md's exercise table from the registry")
    p = sub.add_parser("new", help="the skeleton of a new exercise: python -m grader new q16 function_name")
    p.add_argument("qid")
    p.add_argument("function")
    p.add_argument("--title", default="TODO title")
    p.add_argument("--points", type=int, default=10)
    p.add_argument("--schedule", default="", metavar="NAME",
                   help="a pipelined step judged against this schedule (afab, 1f1b, ...: lab_src/pipeline/schedules.py)")
    p.add_argument("--needs", nargs="*", metavar="QID",
                   help="the exercises whose answers its checks run (default with --schedule: those of q08)")
    p.add_argument("--module", default="pipeline_lab",
                   help="the course module (assignment) it joins (lab_src/registry.py MODULES; default pipeline_lab)")
    p.add_argument("--module-title", default="", metavar="TITLE",
                   help="--module is a new module, with this title: added to MODULES (last) and MODULE_TITLES")
    p.add_argument("--topic", default="", metavar="NAME",
                   help="an exercise of this topic after the core (lab_src/topics/NAME/, written when it is new)")
    args = ap.parse_args(argv)
    course = Course(args.course)
    command = {"release": cmd_release, "collect": cmd_collect, "autograde": cmd_autograde, "feedback": cmd_feedback,
               "export": cmd_export, "status": cmd_status, "table": cmd_table, "text": cmd_text,
               "new": cmd_new, "readme": cmd_readme, "roster": cmd_roster}[args.command]
    if args.command in PER_ASSIGNMENT:
        return max(command(c, args) for c in course.each(args.assignment))
    return command(course, args)


# the commands run once per assignment (the others act on the whole course at once)
PER_ASSIGNMENT = {"release", "collect", "feedback", "status"}   # autograde: all at once, grade_course


if __name__ == "__main__":
    sys.exit(main())
