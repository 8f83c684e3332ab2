"""The source notebooks as reviewable text: each solutions/ notebook has a jupytext percent-format twin.

    python -m grader text             # solutions/*.ipynb -> solutions/*.py (after editing a notebook)
    python -m grader text --from-py   # solutions/*.py -> solutions/*.ipynb (after editing the text)

nbgrader reads the .ipynb; the .py twin shows a change to a reference answer or a hidden test as a plain
diff, and lets a linter read the reference code (cell metadata, nbgrader's included, rides along in the
`# %%` lines). tests/test_release.py checks that every pair is in sync. The .py files never reach the
student release (course.IGNORE lists them).
"""
from __future__ import annotations

from pathlib import Path

import jupytext


from . import SOURCE

FORMAT = "py:percent"


def pairs(source: Path = SOURCE) -> list[tuple[Path, Path]]:
    return [(nb, nb.with_suffix(".py")) for nb in sorted(source.glob("*/q*.ipynb"))]


def as_text(notebook: Path) -> str:
    return jupytext.writes(jupytext.read(notebook), fmt=FORMAT)


def out_of_sync(source: Path = SOURCE) -> list[str]:
    """The notebooks whose .py twin is missing or says something else."""
    return [nb.name for nb, text in pairs(source) if not text.exists() or text.read_text() != as_text(nb)]


def write_text(source: Path = SOURCE) -> list[Path]:
    written = []
    for nb, text in pairs(source):
        new = as_text(nb)
        if not text.exists() or text.read_text() != new:
            text.write_text(new)
            written.append(text)
    return written


def write_notebooks(source: Path = SOURCE) -> list[Path]:
    """Rebuild each notebook from its edited .py twin, keeping the notebook's own metadata and outputs
    where a cell's source is unchanged."""
    written = []
    for nb, text in pairs(source):
        if not text.exists():
            continue
        old = jupytext.read(nb)
        new = jupytext.read(text)
        merged = jupytext.combine.combine_inputs_with_outputs(new, old, fmt=FORMAT)
        merged.metadata = {**old.metadata, **{k: v for k, v in merged.metadata.items() if k != "jupytext"}}
        merged.metadata.pop("jupytext", None)
        before = nb.read_text()
        jupytext.write(merged, nb, fmt="ipynb")
        if nb.read_text() != before:
            written.append(nb)
    return written
