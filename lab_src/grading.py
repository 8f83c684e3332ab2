"""What the notebooks run while nbgrader executes them, and what the hidden-test cell calls.

The points of each exercise are decided outside the student's notebook: the grader reads the answer
cell from the submitted notebook, runs its hidden tests in fresh processes, and writes the score into
the gradebook (see grader/autograde.py). Code in the notebook could change anything in its own kernel,
so the hidden-test cell in the notebook deliberately never passes: if the grader's out-of-process step
did not run, the exercise scores zero rather than full marks.
"""
from __future__ import annotations

import os
from pathlib import Path

# Set by the grader for nbgrader's run of the notebooks: where its own runs of this submission are saved.
GRADER_TIMELINES = "LAB_GRADER_TIMELINES"


class AwaitingGrader(Exception):
    pass


def scored_out_of_process(qid: str) -> None:
    raise AwaitingGrader(
        f"{qid} is scored by the grader outside this notebook, not by this cell. Instructors: grade with "
        f"`python -m grader autograde`, which runs nbgrader and then the out-of-process hidden tests.")


def autograding() -> bool:
    """True while nbgrader executes a notebook: the visible checks then launch nothing."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))


def grader_view(qid: str) -> dict | None:
    """The grader's saved run of this student's answer to `qid` (for the timeline cell), if there is one."""
    folder = os.environ.get(GRADER_TIMELINES)
    path = Path(folder) / f"{qid}.json" if folder else None
    if path is None or not path.exists():
        return None
    from lab_src.views.saved import load_view
    return load_view(path)
