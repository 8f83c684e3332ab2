"""Benchmark: how long nbgrader's kernels take to start while students are graded several at a time, and
how often a start fails, with nbgrader's own limit (60 s, no retry: "before") and the grader's (the
course's KERNEL_STARTUP_TIMEOUT_S (lab_src/harness/limits.py) and one fresh start: "after").

Each run grades the sample cohort (or --students) in a fresh course with `grader.autograde.grade_all`,
`--jobs` at a time, exactly as `python -m grader autograde` does: one student's hidden tests keep the
cores busy while another student's notebooks are executed. grader/execute.py logs each kernel's start
(KERNEL-START answered after N s) and each retry; nbclient logs each start that failed ("Error occurred
while starting new kernel client ... Kernel didn't respond"). The figures go in README ("Kernel start under load").

    python benchmarks/kernel_start.py [--jobs 2 4] [--settings before after] [--students ada sam ...]
    python benchmarks/kernel_start.py --course DIR      # the same figures for a course graded already
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"before": {"startup_timeout": 60, "startup_retries": 0}, "after": {}}  # after: the course's defaults


def summarize(course_root: Path) -> dict:
    """Kernel starts, failures and retries found in each student's nbgrader log of a graded course."""
    starts, failed_starts, retries, failed_students = [], 0, 0, []
    for log in sorted(Path(course_root).glob("grader/*/nbgrader.log")):
        text = log.read_text(errors="replace")
        starts += [float(s) for s in re.findall(r"KERNEL-START answered after ([\d.]+) s", text)]
        failed_starts += text.count("Error occurred while starting new kernel client")   # nbclient, once a failure
        retries += text.count("KERNEL-START-RETRY")
        status = json.loads((log.parent / "status.json").read_text())
        if status.get("state") != "graded":
            failed_students.append(log.parent.name)
    ordered = sorted(starts)
    return {"students": len(list(Path(course_root).glob("grader/*/nbgrader.log"))),
            "kernel_starts": len(starts) + failed_starts, "failed_starts": failed_starts, "retries": retries,
            "students_failed": failed_students,
            "start_s": {"median": round(statistics.median(ordered), 1) if ordered else None,
                        "p95": round(ordered[int(0.95 * (len(ordered) - 1))], 1) if ordered else None,
                        "max": round(ordered[-1], 1) if ordered else None}}


def grade_once(students: list[str], jobs: int, setting: str) -> dict:
    from grader.autograde import grade_all
    from grader.cli import collect_folder
    from grader.cohort import BY_NAME, build_cohort
    from grader.course import Course
    with tempfile.TemporaryDirectory(prefix="pp-lab-kernels-") as tmp:
        tmp = Path(tmp)
        build_cohort(tmp / "submissions", [BY_NAME[s] for s in students])
        course = Course(tmp / "course", **SETTINGS[setting])
        collect_folder(course, tmp / "submissions")
        course.ensure_assignment()
        started = time.monotonic()
        grade_all(course, students, jobs=jobs)
        out = summarize(course.root)
        out.update(setting=setting, jobs=jobs, startup_timeout=course.startup_timeout,
                   startup_retries=course.startup_retries, wall_s=round(time.monotonic() - started))
    return out


def line(r: dict) -> str:
    s = r["start_s"]
    return (f"{r.get('setting', 'course'):>6} jobs {r.get('jobs', '?')}: {r['kernel_starts']} kernel starts, "
            f"{r['failed_starts']} did not answer in time, {r['retries']} retried; students failed "
            f"{len(r['students_failed'])} of {r['students']} {r['students_failed'] or ''}; start time median "
            f"{s['median']} s, p95 {s['p95']} s, max {s['max']} s" + (f"; {r['wall_s']} s" if "wall_s" in r else ""))


def main() -> int:
    sys.path.insert(0, str(ROOT))
    import os
    from grader.cohort import COHORT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--settings", nargs="+", default=["before", "after"], choices=list(SETTINGS))
    ap.add_argument("--students", nargs="+", default=[s.name for s in COHORT])
    ap.add_argument("--course", type=Path, help="only summarise this graded course")
    args = ap.parse_args()
    if args.course:
        print(line(summarize(args.course)))
        return 0
    print(f"{len(args.students)} students, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    for jobs in args.jobs:
        for setting in args.settings:
            r = grade_once(args.students, jobs, setting)
            print(line(r), flush=True)
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
