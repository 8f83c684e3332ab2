"""Read an exercise's answer out of a notebook, without running the notebook.

The answer to qNN is the code cell whose nbgrader grade_id is "qNN_answer". Its first line is the
`%%answer qNN` magic, which is dropped; so are nbgrader's solution markers in the source notebooks.
The grader uses this on submitted notebooks: what is graded is what the student's answer cell says,
whatever their kernel did.
"""
from __future__ import annotations

import json
from pathlib import Path

from lab_src.registry import CODED, exercise

MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


class NotebookUnreadable(ValueError):
    pass


def notebook_problem(path: Path) -> str | None:
    """Why nbgrader could not read the notebook at `path` (None when it can): not valid JSON (with the
    line and column), not a notebook, or cells that lost what nbformat requires (their metadata, say)."""
    import nbformat
    name = Path(path).name
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        return f"{name} cannot be read as text: {e}"
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        return (f"{name} is not valid JSON: {e.msg.removesuffix(' at')} (line {e.lineno}, column {e.colno}; "
                f"was the file cut off, or edited by hand?)")
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return f"{name} is not a Jupyter notebook: it holds no list of cells"
    try:
        nbformat.validate(nbformat.reads(text, as_version=4))
    except Exception as e:  # noqa: BLE001 - nbformat raises several kinds of errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{name} is not a valid notebook: {first[:300]}"
    return None


def read_notebook(path: Path) -> dict:
    """The notebook at `path` as JSON, if nbgrader could read it too (else NotebookUnreadable, saying why:
    a notebook nbgrader cannot grade scores zero here as well)."""
    problem = notebook_problem(path)
    if problem:
        raise NotebookUnreadable(problem)
    return json.loads(Path(path).read_text(encoding="utf-8"))


def cell_source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def find_cell(nb: dict, grade_id: str) -> dict | None:
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}) if isinstance(cell, dict) else {}
        if isinstance(meta, dict) and isinstance(meta.get("nbgrader"), dict) \
                and meta["nbgrader"].get("grade_id") == grade_id:
            return cell
    return None


def answer_source(nb: dict, qid: str) -> str | None:
    """The module text of the answer to `qid` in notebook `nb`, or None if there is no answer cell."""
    cell = find_cell(nb, exercise(qid).answer_cell)
    if cell is None or cell.get("cell_type") != "code":
        return None
    lines = cell_source(cell).splitlines()
    if lines and lines[0].lstrip().startswith("%%answer"):
        lines = lines[1:]
    lines = [ln for ln in lines if ln.strip() not in MARKERS]
    return "\n".join(lines) + "\n"


def write_answer_files(notebook_dir: Path, out_dir: Path) -> dict[str, str | None]:
    """Extract every exercise's answer from the notebooks in `notebook_dir` into `out_dir`.

    Returns {qid: path, or None when the notebook or its answer cell is missing or unreadable}, and
    for the None entries the reason in `write_answer_files.reasons` (kept for feedback messages).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, reasons = {}, {}
    for ex in CODED:
        nb_path = Path(notebook_dir) / ex.notebook
        try:
            source = answer_source(read_notebook(nb_path), ex.id) if nb_path.exists() else None
            if not nb_path.exists():
                reasons[ex.id] = f"{ex.notebook} was not submitted"
            elif source is None:
                reasons[ex.id] = f"{ex.notebook} has no answer cell {ex.answer_cell} (was it deleted?)"
        except NotebookUnreadable as e:
            source, reasons[ex.id] = None, str(e)
        if source is None:
            paths[ex.id] = None
            continue
        path = out_dir / ex.answer_file
        path.write_text(source)
        paths[ex.id] = str(path)
    write_answer_files.reasons = reasons
    return paths
