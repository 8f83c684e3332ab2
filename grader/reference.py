"""The reference answers: the answer cells of the source notebooks in solutions/, as module files.

They are extracted on demand into a cache folder named by a hash of the notebooks, so an edit to a
solution notebook takes effect at once and the extracted files are never edited by hand.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from lab_src.registry import ASSIGNMENT, CODED

from . import SOURCE
from .answer_cells import write_answer_files


def source_dir() -> Path:
    return SOURCE / ASSIGNMENT


def reference_sources() -> dict[str, str]:
    """{qid: path of the reference answer file} for every coded exercise."""
    notebooks = sorted(source_dir().glob("q*.ipynb"))
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in notebooks)).hexdigest()[:12]
    cache = Path(os.environ.get("LAB_CACHE", Path(tempfile.gettempdir()) / "pp-lab-cache")) / f"reference-{digest}"
    done = cache / ".complete"
    if not done.exists():
        paths = write_answer_files(source_dir(), cache)
        missing = [q for q, p in paths.items() if p is None]
        if missing:
            raise RuntimeError(f"solutions/ has no reference answer for {missing}: {write_answer_files.reasons}")
        done.touch()
    return {ex.id: str(cache / ex.answer_file) for ex in CODED}
