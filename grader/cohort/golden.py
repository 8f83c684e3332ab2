"""The cohort's golden record: what grading the sample cohort gave, kept to show that a refactor changes none of it.

    python -m grader.cohort golden                  # grade the whole cohort and compare with the record
    python -m grader.cohort golden --write          # grade it and write the record (a deliberate change)
    python -m grader.cohort golden --course DIR     # the same, from a course graded already (DIR/autograded/...)
    python -m grader.cohort golden --write --student vera   # grade vera alone and record her entries again,
                                                            # every other student's left as recorded

The record, tests/golden/cohort.json, holds per student the points of each exercise, and per student and
notebook the texts their feedback shows: the verdict in the hidden-test cell (score and the grader's
messages), the note on a notebook the grader could not read, and what the other cells printed or raised
while nbgrader ran them (pictures, the API's help() and the student's own answer cells left out).
Each distinct text is stored once, under a key made of it. tests/test_cohort.py compares the graded
cohort with the record.

Texts are kept as they are but for what differs from one grading to the next by nature: the course's folder
and, when a rank's process exits, where each rank that exited was at the time (`normalise`); whether a
kernel noticed in time that an answer killed its fork server (the KernelDied note), and so which of the
notebook's cells ran before its kernel ended (only the verdict is kept of such a notebook, kim's q02); and how a cell's
printed text was cut into outputs (a print's line and its newline came as two outputs in one grading and as
one in another: the pieces of one stream are joined, as the page shows them).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import tempfile
from pathlib import Path

from lab_src.registry import EXERCISES

from .. import ROOT
from ..answer_cells import find_cell
from ..course import Course, hidden_points
from ..report import course_rows
from .grading import grade_cohort
from .students import COHORT, Student

GOLDEN = ROOT / "tests" / "golden" / "cohort.json"
HOW = "python -m grader.cohort golden --write"
NOTE_CELL = "grader-unreadable-notebook"     # grader/staging.py: the note on a notebook nbgrader could not read


# where a rank was when its process exited (lab_src/harness/deadlock.py, report): when one rank dies, how far
# the others had got by the time they were stopped is a race (mo's q08: "after F0, in send_forward(mb=0) to
# rank 1" in one grading, "after send_forward(mb=1) to rank 1, in recv_backward(mb=0) from rank 1" in another)
EXITED_WHERE = re.compile(r"(its process exited with code \d+)(?: after [^,\n]+)?(?:, in [^\n]+)?")


# measured numbers: the pipelined cases of q08, q12 and q15 run on a model whose first stage the grader changes
# by a random amount each grading (pipeline/perturb.py), so a wrong answer's differences from the baseline
# differ from one grading to the next (and with their width, where a message wraps)
MEASURED = re.compile(r"\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+")

# the step at which a wrong answer's loss curve leaves one process's (q13, q18): the training cases change
# stage 0's embedding by a random amount each grading too, so a curve whose first step differs by about the
# tolerance leaves at step 0 in one grading and at step 1 in the next (wren's q18 in a CI run)
STEP_LEFT = re.compile(r"(leaves the single process's at step )\d+")


def normalise(text: str, course: Course) -> str:
    """`text` without what differs between two gradings of the same submissions: the course's folder, where
    each rank whose process exited was at the time, and measured numbers (with how the lines wrap)."""
    text = text.replace(str(course.root.resolve()), "<course>").replace(str(course.root), "<course>")
    text = MEASURED.sub("<number>", EXITED_WHERE.sub(r"\1 <where: a race>", text))
    text = STEP_LEFT.sub(r"\1<step>", text)
    return "\n".join(" ".join(line.split()) for line in text.split("\n\n"))


def _cell_texts(cell: dict) -> list[str]:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    if cell.get("id") == NOTE_CELL:
        return ["".join(cell["source"])]
    if cell["cell_type"] != "code" or meta.get("solution"):
        return []
    texts, stream = [], None
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream" and out["name"] == stream:     # one print can come in pieces
            texts[-1] += "".join(out["text"])
        elif out["output_type"] == "stream":
            texts.append("".join(out["text"]))
        elif out["output_type"] == "error":
            texts.append(f"{out['ename']}: {out['evalue']}")
        stream = out.get("name") if out["output_type"] == "stream" else None
    # whether nbgrader's kernel noticed, before the cell ended, that an answer killed the process that started
    # it (kim) is a race: the cell's KernelDied note (grader/execute.py) is shown in one grading and not the next
    return [t for t in texts if not t.startswith(("Help on ", "KernelDied: "))]


def feedback_texts(course: Course, student: Student) -> dict[str, list[str]]:
    """{notebook: the texts its feedback shows} for each autograded notebook of `student`. Of a notebook whose
    answer ends its kernel (`Student.ends_its_kernel`: kim), the verdict alone: whether the cells after the
    answer ran before the kernel ended is a race (the visible check's line was printed in one grading and not
    in the next, where nbgrader noticed the kernel's end at that cell)."""
    found = {}
    for ex in EXERCISES.values():
        path = course.of(ex.id).autograded(student.name) / ex.notebook     # each in its own assignment's folder
        if path.exists():
            cells = json.loads(path.read_text())["cells"]
            if ex.id in student.ends_its_kernel:     # the grader's note and the hidden-test cell's verdict
                hidden = find_cell({"cells": cells}, ex.hidden_cell)
                cells = [c for c in cells if c is hidden or c.get("id") == NOTE_CELL]
            found[ex.notebook] = [normalise(t, course) for cell in cells for t in _cell_texts(cell)]
    return found


def record(course: Course, rows: dict[str, dict], students=COHORT) -> dict:
    """What grading gave: {"points": {student: {qid: points}}, "feedback": {student: {notebook: [text keys]}},
    "texts": {key: text}}, each text stored once (many students see the same ones) under a key made of it."""
    points = hidden_points()
    texts, feedback = {}, {}
    for s in students:
        feedback[s.name] = {}
        for notebook, shown in feedback_texts(course, s).items():
            keys = [hashlib.sha1(t.encode()).hexdigest()[:12] for t in shown]
            texts.update(zip(keys, shown))
            feedback[s.name][notebook] = keys
    return {"points": {s.name: {qid: rows[s.name].get(qid) for qid in points} for s in students},
            "feedback": feedback, "texts": texts}


def load(path: Path = GOLDEN) -> dict:
    return json.loads(Path(path).read_text())


def write(got: dict, path: Path = GOLDEN) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n")


def differences(got: dict, want: dict) -> list[str]:
    """One line per student's points, and one entry per notebook's feedback, that are not as recorded."""
    lines = []
    for student in sorted(set(got["points"]) | set(want["points"])):
        a, b = got["points"].get(student, {}), want["points"].get(student, {})
        lines += [f"{student} {qid}: {a.get(qid)} points, recorded {b.get(qid)}"
                  for qid in sorted(set(a) | set(b)) if a.get(qid) != b.get(qid)]
    for student in sorted(set(got["feedback"]) | set(want["feedback"])):
        a, b = got["feedback"].get(student, {}), want["feedback"].get(student, {})
        for notebook in sorted(set(a) | set(b)):
            shown = [got["texts"][k] for k in a.get(notebook, [])]
            recorded = [want["texts"][k] for k in b.get(notebook, [])]
            if shown != recorded:
                lines.append(f"{student} {notebook}: the feedback shows\n{_texts(shown)}\n  recorded:\n{_texts(recorded)}")
    return lines


def merged(got: dict, want: dict, names: list[str]) -> dict:
    """The record `want` with the entries of the students `names` taken from `got`, and only the texts that
    some entry still shows."""
    out = {"points": {**want["points"], **{n: got["points"][n] for n in names}},
           "feedback": {**want["feedback"], **{n: got["feedback"][n] for n in names}}}
    texts = {**want["texts"], **got["texts"]}
    used = {k for by_notebook in out["feedback"].values() for keys in by_notebook.values() for k in keys}
    out["texts"] = {k: texts[k] for k in sorted(used)}
    return out


def _texts(texts: list[str]) -> str:
    return "\n".join("    | " + line for t in texts for line in t.splitlines()) or "    (nothing)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.cohort golden", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN.relative_to(ROOT)} instead of comparing")
    parser.add_argument("--course", type=Path, help="a course with the whole cohort graded already")
    parser.add_argument("--student", nargs="+", metavar="NAME",
                        help="grade these students alone; with --write, record their entries again and no one else's")
    args = parser.parse_args(argv)
    chosen = [s for s in COHORT if s.name in args.student] if args.student else list(COHORT)
    if args.student and len(chosen) != len(set(args.student)):
        parser.error(f"no such student: {sorted(set(args.student) - {s.name for s in chosen})}")
    if args.course:
        course = Course(args.course)
        got = record(course, {r["student"]: r for r in course_rows(course)}, chosen)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            course, _, rows = grade_cohort(Path(tmp), chosen)
            got = record(course, rows, chosen)
    want = load()
    if args.write:
        write(merged(got, want, [s.name for s in chosen]) if args.student else got)
        print(f"wrote {GOLDEN}" + (f" ({', '.join(args.student)} recorded again)" if args.student else ""))
        return 0
    if args.student:        # compare the chosen students' entries alone
        want = {"points": {n: want["points"].get(n, {}) for n in args.student},
                "feedback": {n: want["feedback"].get(n, {}) for n in args.student}, "texts": want["texts"]}
    diff = differences(got, want)
    print("\n".join(diff) if diff else f"as recorded in {GOLDEN}")
    return 1 if diff else 0
