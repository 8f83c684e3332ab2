"""The reference answers: the answer cells of the source notebooks in solutions/, as module files.

They are extracted into a cache folder of the grading user's own (mode 0700; `LAB_CACHE` or
~/.cache/pp-lab), named by a hash of the notebooks, so an edit to a solution notebook takes effect at
once. The cache is verified, not trusted: every time the references are used, each file is compared
with the answer cell it comes from (extracted again in memory) and rewritten if anything changed it.
No sandboxed process ever sees this folder: a launch gets copies in its own run folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from lab_src.registry import ASSIGNMENT, CODED, exercise

from . import SOURCE
from .answer_cells import answer_source, read_notebook


def source_path(ex) -> Path:
    return SOURCE / ex.assignment / ex.notebook


def source_dir(assignment: str = ASSIGNMENT) -> Path:
    """The source notebooks of one assignment (the core's by default)."""
    return SOURCE / assignment


def cache_root() -> Path:
    if os.environ.get("LAB_CACHE"):
        return Path(os.environ["LAB_CACHE"])
    home = Path.home()
    return (home / ".cache" / "pp-lab") if os.access(home, os.W_OK) else \
        Path(tempfile.gettempdir()) / f"pp-lab-cache-{os.geteuid()}"


def _reference(nb: dict, ex) -> str:
    text = answer_source(nb, ex.id)
    if text is None:
        raise RuntimeError(f"solutions/ has no reference answer for {ex.id} ({ex.notebook})")
    return text


def reference_texts() -> dict[str, str]:
    """{qid: the reference answer's source}, read from the source notebooks now."""
    return {ex.id: _reference(read_notebook(source_path(ex)), ex) for ex in CODED}


def reference_text(qid: str) -> str:
    """The reference answer to `qid`, read from its source notebook now: as plain JSON (no nbformat, whose
    validation costs seconds) and without the cache folder, so it writes nothing anywhere. The sample
    cohort's answers are built from it (grader/cohort/mistakes.py)."""
    ex = exercise(qid)
    return _reference(json.loads(source_path(ex).read_text(encoding="utf-8")), ex)


def reference_sources() -> dict[str, str]:
    """{qid: path of the reference answer file} for every coded exercise, each file checked against
    its notebook's answer cell before it is handed out."""
    texts = reference_texts()
    digest = hashlib.sha256("\0".join(texts[q] for q in sorted(texts)).encode()).hexdigest()[:16]
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    cache = root / f"reference-{digest}"
    cache.mkdir(mode=0o700, exist_ok=True)
    paths = {}
    for ex in CODED:
        path = cache / ex.answer_file
        if not path.exists() or path.read_text() != texts[ex.id]:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(texts[ex.id])
            os.replace(tmp, path)
        paths[ex.id] = str(path)
    return paths
