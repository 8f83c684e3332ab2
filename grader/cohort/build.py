"""Write the sample cohort's submissions: one folder of notebooks per student.

    python -m grader.cohort OUT_DIR          # OUT_DIR/<student>/qNN_*.ipynb (+ whatever a student adds)

The answer cells come from answers/ (students.py says whose is which).

A submission is the release's notebooks of the assignments the student returns, with answer cells (and
written answers) filled in as the student's story says. `grader collect --from OUT_DIR` then files them into
the course, as returned notebooks would be.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from lab_src.registry import EXERCISES

from .. import RELEASE, SOURCE
from ..answer_cells import MARKERS, cell_source, find_cell
from .answers import answer
from .roster import write_roster
from .students import COHORT, Student

ROSTER = "roster.csv"   # beside the students' folders (a file: `grader collect --from` takes folders only)


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _save(nb: dict, path: Path) -> None:
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def _reference_text(source_cell: dict) -> str:
    return "\n".join(ln for ln in cell_source(source_cell).splitlines() if ln.strip() not in MARKERS)


def submission_notebook(student: Student, qid: str) -> dict:
    ex = EXERCISES[qid]
    nb = _load(RELEASE / ex.assignment / ex.notebook)
    if student.base == "reference":
        source = _load(SOURCE / ex.assignment / ex.notebook)
        for cell in nb["cells"]:
            meta = cell.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution"):
                cell["source"] = _reference_text(find_cell(source, meta["grade_id"]))
    if qid in student.answers:
        text = student.answers[qid]
        if text is None:  # back to the release's stub
            text = cell_source(find_cell(_load(RELEASE / ex.assignment / ex.notebook), ex.answer_cell))
        else:
            text = f"%%answer {qid}\n" + text.strip("\n")
        find_cell(nb, ex.answer_cell)["source"] = text
    return nb


# ---- what some students do to their submission ------------------------------------------------
def patch_in_earlier_cell(folder: Path) -> None:
    for ex in EXERCISES.values():
        path = folder / ex.notebook
        if not path.exists():     # an assignment not returned
            continue
        nb = _load(path)
        patch = {"cell_type": "code", "execution_count": None, "id": f"patch-{ex.id}", "metadata": {},
                 "outputs": [], "source": answer("kernel_patches").strip("\n")}
        nb["cells"].insert(2, patch)
        _save(nb, path)


def delete_and_edit_tests(folder: Path) -> None:
    q05 = _load(folder / EXERCISES["q05"].notebook)
    q05["cells"] = [c for c in q05["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") != "q05_hidden"]
    _save(q05, folder / EXERCISES["q05"].notebook)
    q06 = _load(folder / EXERCISES["q06"].notebook)
    find_cell(q06, "q06_hidden")["source"] = "# nothing to see here\npass"
    _save(q06, folder / EXERCISES["q06"].notebook)


def fake_packages(folder: Path) -> None:
    (folder / "torch.py").write_text("# a fake torch: anything run from this folder imports this\n"
                                     "import sys\nprint('fake torch imported', file=sys.stderr)\n")
    fake = folder / "lab_src"
    fake.mkdir(exist_ok=True)
    (fake / "__init__.py").write_text("def scored_out_of_process(qid):\n    return None\n")
    (fake / "grading.py").write_text("def scored_out_of_process(qid):\n    return None\n")


def corrupt_q03(folder: Path) -> None:
    path = folder / EXERCISES["q03"].notebook
    path.write_text(path.read_text()[:500])  # cut off mid-file: not valid JSON


def drop_q04(folder: Path) -> None:
    (folder / EXERCISES["q04"].notebook).unlink()


EDITS = {f.__name__: f for f in (patch_in_earlier_cell, delete_and_edit_tests, fake_packages, corrupt_q03, drop_q04)}


def build_student(student: Student, out: Path) -> Path:
    folder = out / student.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for qid in EXERCISES:     # the notebooks of the assignments the student returns (students.py)
        if student.returned(qid):
            _save(submission_notebook(student, qid), folder / EXERCISES[qid].notebook)
    for edit in student.edits:
        EDITS[edit](folder)
    return folder


def build_cohort(out: Path, students=COHORT) -> list[Path]:
    """Each student's folder under `out`, and their names in `out`/roster.csv (grader/cohort/roster.py)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_roster(out / ROSTER, students)
    return [build_student(s, out) for s in students]

