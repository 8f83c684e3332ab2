"""README's first command (`make demo`): the lab end to end, on this machine's CPU.

1. The reference All-Forward-All-Backward step on 4 torchrun processes (gloo), compared rank by rank
   with the unsharded baseline; the measured schedule, the bubble beside (p-1)/(m+p-1), and a
   Chrome-trace JSON to open in Perfetto.
2. The student release regenerated from solutions/ with nbgrader, one assignment per course module
   (and compared with notebooks/).
3. A handful of sample students autograded in every assignment (nbgrader + the out-of-process hidden
   tests): a complete one, an untouched one, mistakes of different kinds, a cheat; the grade table, the
   feedback, what nbgrader's own formgrader shows, and where to open it. `--cohort all` (`make demo
   COHORT=all`): the whole sample cohort, as `make test` grades it.

    python -m grader.demo [--out out/demo] [--cohort all | --cohort ada,ivo,...] [--jobs N] [--skip-cohort]
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

from lab_src.harness.baselines import baselines_for
from lab_src.harness.case import Case
from lab_src.harness.runner import run_cases
from lab_src.judge.compare import close
from lab_src.pipeline.config import DEMO
from lab_src.views import bubble, text_grid
from lab_src.views.chrome_trace import write_chrome_trace

from . import RELEASE
from .autograde import DEFAULT_JOBS
from .reference import reference_sources

# the demo's students: a complete one, an untouched one, a numbers mistake (q08's loss not divided), a deadlock
# (q07), mistakes in the later assignments (wren: q11 and q12 of pipeline_schedules, q18 of tensor_parallel), and a
# cheat (pia); and the assignments each returned (None: those of the student's story, grader/cohort/students.py)
DEMO_STUDENTS = {"ada": None, "untouched": ["pipeline_lab"], "ivo": ["pipeline_lab"], "hana": ["pipeline_lab"],
                 "wren": None, "pia": ["pipeline_lab"]}


def banner(text: str) -> None:
    print(f"\n{'=' * 100}\n{text}\n{'=' * 100}", flush=True)


def pipeline_demo(out: Path) -> bool:
    cfg = DEMO
    ref = reference_sources()
    banner(f"1. The reference pipeline on {cfg.num_stages} CPU processes: {cfg.describe()}")
    started = time.monotonic()
    base = baselines_for([cfg], ref)[cfg]
    print(f"baseline (whole model, one process): loss {base['loss']:.6f}, "
          f"{time.monotonic() - started:.1f} s", flush=True)
    # two identical cases: the first warms up each process, the second is the one shown
    cases = [Case(kind="pipeline", qid="q08", config=cfg, answers=ref, label=what)
             for what in ("warm-up", "the step shown")]
    run = run_cases(cases, out / "run", case_deadline_s=120, timeout_s=60)
    outcome = run.outcomes[1]
    if outcome.failure or outcome.errors():
        print("the reference run failed:", outcome.failure or outcome.errors())
        return False
    print(f"torchrun: {len(run.launches)} launch, {run.wall_s:.1f} s including start-up\n")
    ok = True
    for r in range(cfg.num_stages):
        o = outcome.obs[r]
        grads = o["grads"]
        diffs = [float((g - base["grads"][n]).abs().max()) for n, g in grads.items()]
        match = all(close(g, base["grads"][n]) for n, g in grads.items())
        ok &= match
        pieces = (["embed"] if r == 0 else []) + [f"blocks {o['layers'][0]}-{o['layers'][-1]}"] + \
                 (["head"] if r == cfg.num_stages - 1 else [])
        line = (f"rank {r}: {' + '.join(pieces):<24} built {len(o['built'])} pieces, "
                f"{len(grads)} parameters: gradients {'match' if match else 'DIFFER from'} the baseline "
                f"(largest difference {max(diffs):.1e})")
        if r == cfg.num_stages - 1:
            import torch
            outs = torch.cat(o["outputs"])
            out_ok = close(outs, base["output"])
            ok &= out_ok
            line += (f"\n{'':8}outputs of {len(o['outputs'])} micro-batches {'match' if out_ok else 'DIFFER'} "
                     f"(largest difference {float((outs - base['output']).abs().max()):.1e}); "
                     f"loss {o['loss']:.6f} vs baseline {base['loss']:.6f}")
        print(line)
    events = outcome.events()
    print("\nThe measured schedule of the step (one row per rank):")
    print(text_grid.time_grid(events, cfg.num_stages, width=96))
    print("\n" + bubble.describe(events, cfg.num_stages, cfg.num_microbatches))
    sent = bubble.bytes_sent(events, cfg.num_stages)
    print("bytes sent: " + ", ".join(f"rank {r} {b / 1e6:.2f} MB" for r, b in sent.items()))
    trace = write_chrome_trace(events, out / "afab_trace.json", f"AFAB, {cfg.describe()}")
    print(f"\nChrome trace: {trace}  (open it at https://ui.perfetto.dev or chrome://tracing)")
    return ok


def release_demo(course) -> bool:
    banner("2. The student release: nbgrader generate_assignment, solutions/<assignment>/ -> notebooks/<assignment>/")
    same = True
    for one in course.each():
        fresh = one.generate_release()
        committed = RELEASE / one.assignment
        names = sorted(p.name for p in fresh.iterdir())
        ok = names == sorted(p.name for p in committed.iterdir()) and \
            all(filecmp.cmp(fresh / n, committed / n, shallow=False) for n in names)
        same &= ok
        print(f"{one.assignment:<20} {len(one.exercises):>2} notebooks and README.md: " +
              ("identical to the committed release in notebooks/" if ok
               else "DIFFERENT from notebooks/: run `python -m grader release` and commit"))
    print(f"(the course's assignments: {', '.join(course.plan.modules)}; course.toml chooses them)")
    return same


def cohort_demo(course, students: dict[str, list[str] | None], jobs: int) -> bool:
    from .autograde import grade_course
    from .cli import collect_folder
    from .cohort import BY_NAME, ROSTER, build_cohort
    from .feedback import generate_feedback
    from .formgrader_view import describe, problems
    from .report import course_rows, format_table
    # each student with the assignments they return in this course (the demo's list, else their story's):
    # their notebooks, and the points they are expected to get, follow from it (grader/cohort/students.py)
    chosen = []
    for name in students:
        returns = tuple(a for a in course.plan.modules if a in (students[name] or BY_NAME[name].assignments()))
        if returns:
            chosen.append(replace(BY_NAME[name], returns=returns))
    banner(f"3. Autograding {len(chosen)} sample students, each assignment, {jobs} students at a time")
    for s in chosen:
        print(f"  {s.name:<10} {s.story}" + ("" if s.assignments() == tuple(course.plan.modules) else
                                            f" (returned {', '.join(s.assignments())})"))
    out = course.root.parent
    for sub in ("submitted", "autograded", "feedback", "grader", *(f"grader.{a}" for a in course.plan.modules)):
        if (course.root / sub).exists():
            shutil.rmtree(course.root / sub)
    if (out / "cohort").exists():
        shutil.rmtree(out / "cohort")       # students of an earlier run are not this one's
    build_cohort(out / "cohort", chosen)
    for one in course.each():
        collect_folder(one, out / "cohort")
        one.ensure_assignment()
    course.import_roster(out / "cohort" / ROSTER)
    started = time.monotonic()
    print(flush=True)
    results = grade_course(course, [s.name for s in chosen], jobs=jobs,
                           on_done=lambda s, r: print(f"  graded {s:<10} {r['assignment']:<20} {r.get('wall_s', 0):5.0f} s  "
                                                      f"{r['state']}" + (f": {r['error'][:200]}" if r.get("error") else ""),
                                                      flush=True))
    print(f"\n{len(chosen)} students, {len(course.plan.modules)} assignments, in {time.monotonic() - started:.0f} s\n")
    rows = {r["student"]: r for r in course_rows(course)}
    print(format_table(list(rows.values())))
    started = time.monotonic()
    unseen = {}
    print("\nnbgrader's formgrader, Manage Submissions, per assignment:")
    for one in course.each():
        names = [s.name for s in chosen if one.assignment in s.assignments()]
        if not names:
            continue
        missing = generate_feedback(one)
        unseen.update({f"{s} ({one.assignment})": why for s, why in {**problems(one, names), **missing}.items()})
        print(f" {one.assignment}")
        print(describe(one, names))
    print(f"\nfeedback (nbgrader generate_feedback) in {time.monotonic() - started:.0f} s, under {course.root / 'feedback'}")
    points = course.hidden_points()
    wrong = [f"{s.name} {qid}" for s in chosen for qid, want in s.expected_points(points).items()
             if want is not None and abs(rows.get(s.name, {}).get(qid, -1) - want) > 1e-6]
    failed = {s: r.get("error", "") for s, r in results.items() if r["state"] != "graded"}
    for student, why in sorted(failed.items()):
        print(f"FAILED {student}: {why}")
    for student, why in sorted(unseen.items()):
        print(f"NOT IN NBGRADER'S VIEW {student}: {why}")
    if wrong:
        print(f"UNEXPECTED POINTS: {wrong}")
    ok = not wrong and not failed and not unseen
    print(f"\nformgrader: cd {course.root} && {Path(sys.executable).parent / 'jupyter'} lab   "
          f"(Nbgrader > Formgrader: one row per assignment)")
    print(f"\nevery student got exactly the expected points, and nbgrader's formgrader shows all {len(chosen)} "
          f"autograded with their feedback" if ok else
          f"\n{len(failed)} failed, {len(unseen)} not autograded or without feedback in nbgrader's view, "
          f"{len(wrong)} unexpected scores (see above)")
    return ok


def setup_times() -> dict[str, float]:
    """The set-up's phases as scripts/demo.sh measured them (LAB_DEMO_SETUP="venv=12.3,system packages=0.1")."""
    out = {}
    for part in filter(None, os.environ.get("LAB_DEMO_SETUP", "").split(",")):
        name, _, seconds = part.partition("=")
        out[f"set-up: {name}"] = float(seconds)
    return out


def print_times(phases: dict[str, float]) -> None:
    total = sum(phases.values())
    print(f"\nmake demo took {int(total // 60)} min {total % 60:.0f} s:")
    for name, seconds in phases.items():
        print(f"  {name:<28} {seconds:6.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    ap.add_argument("--cohort", default="",
                    help=f"the sample students to grade: all (every assignment), or names with commas (default: "
                         f"{','.join(DEMO_STUDENTS)}, each with the assignments they returned)")
    ap.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    ap.add_argument("--skip-cohort", action="store_true")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    from lab_src.harness import sandbox

    from .cohort import COHORT
    from .course import Course
    if not args.skip_cohort and not sandbox.available():
        # said once, before any work: the grading of every student would fail on it
        print(f"make demo cannot grade here: {sandbox.describe_unavailable()}.", file=sys.stderr)
        return 2
    phases = setup_times()
    started = time.monotonic()
    ok = pipeline_demo(out)
    phases["the reference pipeline"] = time.monotonic() - started
    # a course without JupyterHub: its own exchange folder, so that the formgrader's Manage Assignments page
    # works (release and collect through it) instead of warning that the exchange is missing
    course = Course(out / "course", release=out / "release", exchange=out / "course" / "exchange")
    started = time.monotonic()
    ok &= release_demo(course)
    phases["the release (nbgrader)"] = time.monotonic() - started
    if not args.skip_cohort:
        students = DEMO_STUDENTS if not args.cohort else dict.fromkeys(
            [s.name for s in COHORT] if args.cohort == "all" else args.cohort.split(","))
        started = time.monotonic()
        ok &= cohort_demo(course, students, args.jobs)
        phases["grading the students"] = time.monotonic() - started
    print_times(phases)
    print("\ndemo finished" + ("" if ok else " WITH PROBLEMS (see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
