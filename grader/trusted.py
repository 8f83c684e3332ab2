"""Grade one submission out of process: the hidden tests of every exercise, from the submitted notebooks.

    python -P -m grader.trusted SUBMISSION_DIR --work WORK_DIR   # prints the verdicts as JSON

This process never imports student code and never runs the student's kernel; the workers that run it
are sandboxed (bubblewrap: lab_src/harness/sandbox.py). It reads each answer
cell out of the submitted notebooks (grader/answer_cells.py), writes it to a module file, and hands the
files to workers, which run them beside the reference answers: every exercise's cases, in groups forked one
after the other by a fork server in one sandbox (lab_src/harness/runner.py, zygote.py). The workers only
report what they observed; this process compares that
with the reference baselines and answers, and writes the verdicts to a pipe the caller passed by descriptor
(`--verdicts-fd`), which no sandboxed process holds. Run it from a folder outside the submission with `-P`, so that a torch.py or a
lab_src/ inside the submission cannot shadow the real ones.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

from lab_src.judge.problems import Problem
from lab_src.judge.summary import render
from lab_src.registry import CODED, exercise
from lab_src.harness import limits
from lab_src.harness.runner import run_cases

from .answer_cells import write_answer_files
from .lean_imports import leave_out
from .hidden import hidden_tests
from .hidden.common import CONFIGS, Context, Item
from .reference import reference_sources


def score(items: list[Item]) -> float:
    """Mean over parts of the share of items passed (so 60 unit calls do not outweigh 3 pipelines)."""
    parts: dict[str, list[Item]] = defaultdict(list)
    for item in items:
        parts[item.part].append(item)
    if not parts:
        return 0.0
    return sum(sum(i.score for i in its) / len(its) for its in parts.values()) / len(parts)


def summarize(qid: str, items: list[Item]) -> dict:
    """The verdict of one exercise: its score, and what went wrong as the visible checks say it: the
    causes first, then what they caused, each said once with where else it showed (judge/summary.py)."""
    failed = [i for i in items if not i.passed]
    lines = [f"{qid}: {len(items) - len(failed)} of {len(items)} hidden checks passed"]
    lines += render([p for item in failed for p in item.problems], limit=8)
    return {"fraction": round(score(items), 4), "passed": len(items) - len(failed), "total": len(items),
            "messages": lines}


def missing_verdict(qid: str, reason: str) -> dict:
    ex = exercise(qid)
    return {"fraction": 0.0, "passed": 0, "total": 0,
            "messages": [f"{qid}: not graded: {reason}. The grader reads the cell that starts with "
                         f"%%answer {qid} in {ex.notebook}."]}


def drawn_run(outcomes, label: str) -> list:
    """The run of `label` for the notebook's timeline; when it was not run (earlier cases of the
    exercise deadlocked), the first run of the exercise that recorded something and failed."""
    chosen = [o for o in outcomes if o.case.label == label]
    if chosen and not chosen[0].events(recovered=True):
        failed = [o for o in outcomes if (o.errors() or o.failure) and o.events(recovered=True)]
        return failed[:1] or chosen
    return chosen


def save_timeline(qid: str, outcomes, items: list[Item], folder: Path) -> None:
    """The events of the grader's run of `qid` (whatever the ranks recorded, even of a failed run, with
    where each rank was left waiting), and what went wrong in it, for the notebook's timeline cell."""
    if not outcomes:
        return
    from lab_src.views.saved import kind_view, save_view
    view = kind_view(outcomes[0])
    view["title"] = (f"the grader's run of {qid}: " + (f"{outcomes[0].case.label}; every message of each rank"
                                                       if view.get("compute_free") else
                                                       f"{view['stages']} stages, {view['microbatches']} micro-batches"))
    label = outcomes[0].case.label
    view["messages"] = render([p for i in items if i.name == label for p in i.problems], limit=6)
    save_view(view, folder / f"{qid}.json")


UNSAFE = ("graded WITHOUT a sandbox (--unsafe-no-sandbox): the student's code ran as the grading user and "
          "could have read the reference answers or changed the grader's files")


def read_answers(submissions: list[Path], out: Path) -> tuple[dict, dict]:
    """The answers of one student's submitted assignments (one folder each, named for its assignment) in
    `out`: each exercise's from the folder of its own assignment, else from the first folder that has it.
    Returns ({qid: path or None}, {qid: why None})."""
    found = []
    for n, folder in enumerate(submissions):
        paths = write_answer_files(folder, out.parent / f"{out.name}.{n}" if len(submissions) > 1 else out)
        found.append((folder.name, paths, dict(write_answer_files.reasons)))
    if len(found) == 1:
        return found[0][1], found[0][2]
    out.mkdir(parents=True, exist_ok=True)
    student, reasons = {}, {}
    for ex in CODED:
        ranked = sorted(found, key=lambda f: f[0] != ex.assignment)   # its own assignment's folder first
        chosen = next((f for f in ranked if f[1].get(ex.id)), ranked[0])
        if chosen[1].get(ex.id):
            path = out / ex.answer_file
            path.write_text(Path(chosen[1][ex.id]).read_text())
            student[ex.id] = str(path)
        else:
            student[ex.id] = None
            reasons[ex.id] = chosen[2].get(ex.id, "no answer")
    return student, reasons


def grade_submission(submission: Path | list[Path], work: Path, only: list[str] | None = None,
                     sandboxed: bool = True) -> dict:
    """Every hidden test of `submission`'s answers (a folder of notebooks, or a student's several
    assignments, graded together in one sandboxed launch with one set of baselines); `sandboxed` (the
    default) runs each launch in bubblewrap (lab_src/harness/sandbox.py) and refuses to grade where none can start."""
    if sandboxed:
        from lab_src.harness import sandbox
        if not sandbox.available():
            raise sandbox.SandboxUnavailable(f"refusing to grade: {sandbox.describe_unavailable()}. Pass "
                                             f"--unsafe-no-sandbox to grade anyway (every report will say so).")
    started = time.monotonic()
    work.mkdir(parents=True, exist_ok=True)
    student, reasons = read_answers([submission] if isinstance(submission, Path) else list(submission),
                                    work / "answers")
    ctx = Context(student=student, reference=reference_sources(), folder=work / "baselines")

    verdicts, cases_of, all_cases = {}, {}, []
    for ex in CODED:
        if only and ex.id not in only:
            continue
        if student.get(ex.id) is None:
            verdicts[ex.id] = missing_verdict(ex.id, reasons.get(ex.id, "no answer"))
            continue
        cases_of[ex.id] = hidden_tests(ex.id).cases(ctx)
        all_cases += cases_of[ex.id]
    if all_cases:   # an assignment with no answer to grade (returned untouched) needs no baseline
        ctx.baselines.add(CONFIGS.values())
    run = run_cases(all_cases, work / "run", case_deadline_s=limits.GRADING_CASE_DEADLINE_S,
                    timeout_s=limits.GRADING_RECV_TIMEOUT_S,
                    sandboxed=sandboxed) if all_cases else None
    for qid, cases in cases_of.items():
        outcomes = [run.outcomes[c.index] for c in cases]
        try:
            items = hidden_tests(qid).judge(ctx, outcomes)
        except Exception as e:  # noqa: BLE001 - a judging bug must not cost the other exercises
            items = [Item("judge", "grader", [Problem(f"the grader could not judge this exercise: {e!r}", exercise=qid)])]
        verdicts[qid] = summarize(qid, items)
        if not sandboxed:
            verdicts[qid]["messages"].append(f"{qid}: {UNSAFE}")
        drawn = exercise(qid).timeline
        if drawn:
            save_timeline(qid, drawn_run(outcomes, drawn), items, work / "timeline")
    return {"exercises": verdicts, "cases": len(all_cases), "launches": len(run.launches) if run else 0,
            "sandbox": "bubblewrap" if sandboxed else "none (--unsafe-no-sandbox)",
            "wall_s": round(time.monotonic() - started, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("submission", type=Path, nargs="+", help="a submitted assignment's folder (or several of one student's)")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--verdicts-fd", type=int, help="write the verdicts (JSON) to this inherited pipe, not stdout")
    ap.add_argument("--unsafe-no-sandbox", action="store_true", help="grade without bubblewrap (every report says so)")
    args = ap.parse_args(argv)
    leave_out()     # before answer_cells imports nbformat (grader/lean_imports.py)
    result = grade_submission([p.resolve() for p in args.submission], args.work.resolve(), args.only,
                              sandboxed=not args.unsafe_no_sandbox)
    text = json.dumps(result)
    if args.verdicts_fd is None:
        sys.stdout.write(text + "\n")
    else:
        with os.fdopen(args.verdicts_fd, "w") as channel:
            channel.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
