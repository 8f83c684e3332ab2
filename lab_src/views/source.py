"""Show the lab's own code in a notebook, read from the installed lab_src (so it is the code that runs).

    show_source(PipelineStage.forward, PipelineStage.backward)
"""
from __future__ import annotations

import inspect
import textwrap


class Source:
    """Python source that a notebook shows as highlighted code (and a terminal as plain text)."""

    def __init__(self, text: str):
        self.text = text

    def _repr_markdown_(self) -> str:
        return f"```python\n{self.text}\n```"

    def __repr__(self) -> str:
        return self.text


def show_source(*objects) -> Source:
    """The source of each function or class, as it is in the installed lab_src, one after the other."""
    parts = []
    for obj in objects:
        where = f"{inspect.getmodule(obj).__name__}.{obj.__qualname__}"
        parts.append(f"# {where}\n" + textwrap.dedent(inspect.getsource(obj)).rstrip())
    return Source("\n\n".join(parts))
