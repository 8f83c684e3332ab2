"""README's first command (`make demo`): the lab end to end, on this machine's CPU.

1. The reference All-Forward-All-Backward step on 4 torchrun processes (gloo), compared rank by rank
   with the unsharded baseline; the measured schedule, the bubble beside (p-1)/(m+p-1), and a
   Chrome-trace JSON to open in Perfetto.
2. The student release regenerated from solutions/ with nbgrader (and compared with notebooks/).
3. The sample cohort autograded (nbgrader + the out-of-process hidden tests), the grade table, the
   feedback, and what nbgrader's own formgrader shows for every student.

    python -m grader.demo [--out out/demo] [--students ada ivo ...] [--jobs N] [--skip-cohort]
"""
from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import time
from pathlib import Path

from lab_src.harness.baselines import baselines_for
from lab_src.harness.case import Case
from lab_src.harness.runner import run_cases
from lab_src.judge.compare import close
from lab_src.pipeline.config import DEMO
from lab_src.registry import ASSIGNMENT
from lab_src.views import bubble, text_grid
from lab_src.views.chrome_trace import write_chrome_trace

from . import RELEASE
from .autograde import DEFAULT_JOBS
from .reference import reference_sources


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


def release_demo(out: Path) -> bool:
    from .course import Course
    banner("2. The student release: nbgrader generate_assignment, solutions/ -> notebooks/")
    fresh = out / "release"
    if fresh.exists():
        shutil.rmtree(fresh)
    Course(out / "release-course", release=fresh).generate_release()
    committed = RELEASE / ASSIGNMENT
    names = sorted(p.name for p in (fresh / ASSIGNMENT).glob("*.ipynb"))
    same = names == sorted(p.name for p in committed.glob("*.ipynb")) and \
        all(filecmp.cmp(fresh / ASSIGNMENT / n, committed / n, shallow=False) for n in names)
    print(f"{len(names)} notebooks generated: " + ("identical to the committed release in notebooks/" if same
          else "DIFFERENT from notebooks/: run `python -m grader release` and commit"))
    return same


def cohort_demo(out: Path, students: list[str] | None, jobs: int) -> bool:
    from .autograde import grade_all
    from .cli import collect_folder
    from .cohort import BY_NAME, COHORT, ROSTER, build_cohort
    from .course import Course, hidden_points
    from .feedback import generate_feedback
    from .formgrader_view import describe, problems
    from .report import format_table, grade_rows
    chosen = [BY_NAME[s] for s in students] if students else COHORT
    banner(f"3. Autograding the sample cohort: {len(chosen)} students, {jobs} at a time")
    for s in chosen:
        print(f"  {s.name:<10} {s.story}")
    # a course without JupyterHub: its own exchange folder, so that the formgrader's Manage Assignments
    # page works (release and collect through it) instead of warning that the exchange is missing
    course = Course(out / "course", exchange=out / "course" / "exchange")
    for sub in ("submitted", "autograded", "feedback", "grader"):
        if (course.root / sub).exists():
            shutil.rmtree(course.root / sub)
    build_cohort(out / "cohort", chosen)
    collect_folder(course, out / "cohort")
    course.ensure_assignment()
    course.import_roster(out / "cohort" / ROSTER)
    started = time.monotonic()
    print(flush=True)
    results = grade_all(course, [s.name for s in chosen], jobs=jobs,
                        on_done=lambda s, r: print(f"  graded {s:<10} {r.get('wall_s', 0):5.0f} s  {r['state']}"
                                                   + (f": {r['error'][:200]}" if r.get("error") else ""), flush=True))
    print(f"\n{len(chosen)} submissions in {time.monotonic() - started:.0f} s\n")
    rows = {r["student"]: r for r in grade_rows(course)}
    print(format_table(list(rows.values())))
    started = time.monotonic()
    no_feedback = generate_feedback(course)
    print(f"\nfeedback (nbgrader generate_feedback) in {time.monotonic() - started:.0f} s, "
          f"under {course.root / 'feedback'}")
    # what nbgrader's own views show: the formgrader's Manage Submissions page, and the feedback
    print("\nnbgrader's formgrader, Manage Submissions:")
    print(describe(course, [s.name for s in chosen]))
    points = hidden_points()
    wrong = [f"{s.name} {qid}" for s in chosen for qid, want in s.expected_points(points).items()
             if abs(rows.get(s.name, {}).get(qid, -1) - want) > 1e-6]
    failed = {s: r.get("error", "") for s, r in results.items() if r["state"] != "graded"}
    unseen = {**problems(course, [s.name for s in chosen]), **no_feedback}
    for student, why in sorted(failed.items()):
        print(f"FAILED {student}: {why}")
    for student, why in sorted(unseen.items()):
        print(f"NOT IN NBGRADER'S VIEW {student}: {why}")
    if wrong:
        print(f"UNEXPECTED POINTS: {wrong}")
    ok = not wrong and not failed and not unseen
    print(f"\nformgrader: cd {course.root} && {Path(sys.executable).parent / 'jupyter'} lab   (Nbgrader > Formgrader)")
    print(f"\nevery student got exactly the expected points, and nbgrader's formgrader shows all {len(chosen)} "
          f"autograded with their feedback" if ok else
          f"\n{len(failed)} failed, {len(unseen)} not autograded or without feedback in nbgrader's view, "
          f"{len(wrong)} unexpected scores (see above)")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/demo"))
    ap.add_argument("--students", nargs="*", help="grade only these cohort students (default: all)")
    ap.add_argument("--jobs", type=int, default=DEFAULT_JOBS)
    ap.add_argument("--skip-cohort", action="store_true")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    ok = pipeline_demo(out)
    ok &= release_demo(out)
    if not args.skip_cohort:
        ok &= cohort_demo(out, args.students, args.jobs)
    print("\ndemo finished" + ("" if ok else " WITH PROBLEMS (see above)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
