"""What nbgrader autogrades: a copy of the submission in which a notebook nbgrader cannot read costs only itself.

nbgrader gives up on a student's whole assignment when one of its notebooks is not valid JSON, not a
notebook, or not a valid notebook (cells that lost their metadata, say): no autograded copy and no
feedback for any of the other notebooks. So nbgrader autogrades a copy of the submission,
course/grader/<student>/pipeline_lab/, where each such notebook is replaced by the release's
(unanswered) notebook opened by a note that names the file and what is wrong with it. That exercise
scores zero (the hidden tests read the same notebook and find it unreadable, grader/answer_cells.py),
its feedback shows the note and the grader's message, and every other notebook is graded as usual.
The submission in course/submitted/ is never changed: the instructor still has the file as it came.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path


from .answer_cells import notebook_problem
from .course import Course

def staged(course: Course, student: str) -> Path:
    """nbgrader reads the submission to autograde from here: <course>/grader/<student>/<assignment>/ (for
    another assignment than the core one, grader.<assignment>/: Course.grading_root)."""
    return course.grading_dir(student) / course.assignment


def note_cell(problem: str) -> dict:
    return {"cell_type": "markdown", "id": "grader-unreadable-notebook", "metadata": {},
            "source": f"**The grader could not read this notebook as you submitted it.** {problem}.\n\n"
                      f"What you see here is the unanswered notebook of the release, graded in its place: this "
                      f"exercise scores 0, and the rest of your assignment was graded as usual. Fix the file "
                      f"(open it in a text editor, or restore it from a checkpoint) and submit again."}


def stage_submission(course: Course, student: str, dest: Path | None = None) -> dict[str, str]:
    """Copy the submission for nbgrader (to `dest`, default staged()), replacing each unreadable notebook
    of the assignment. Returns {notebook file name: what is wrong with it} for the replaced ones."""
    src, dest = course.submitted(student), dest or staged(course, student)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)
    problems = {}
    for ex in course.exercises:
        path = dest / ex.notebook
        if not path.exists() and not path.is_symlink():
            continue   # a missing notebook: nbgrader scores it zero itself
        problem = notebook_problem(path) if not path.is_symlink() else f"{ex.notebook} is a symbolic link"
        if problem is None:
            continue
        problems[ex.notebook] = problem
        nb = json.loads((course.release / course.assignment / ex.notebook).read_text())
        nb["cells"].insert(0, note_cell(problem))
        path.unlink()
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False))
    return problems
