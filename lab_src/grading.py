"""What the notebooks run while nbgrader executes them, and what the hidden-test cell calls.

nbgrader executes a notebook in two ways, and sets NBGRADER_EXECUTION to say which: "autograde" (the
instructor grades a submission: the visible checks launch nothing, the grader runs the hidden tests in
its own processes) and "validate" (the student presses Validate, or runs `nbgrader validate`: the
visible checks run for real, and the test cell fails unless this notebook's check passed, so that
Validate says "Success" only for an answer the check accepts).

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
    """True while nbgrader autogrades a notebook: the visible checks then launch nothing. Not while it
    validates one: Validate runs them for real."""
    return os.environ.get("NBGRADER_EXECUTION") == "autograde"


def validating() -> bool:
    return os.environ.get("NBGRADER_EXECUTION") == "validate"


class CheckNotPassed(AssertionError):
    """Validate's failure of a test cell whose check did not pass: its message is the whole story."""

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of a traceback: the student's cell is the test cell they can see, and a frame
        # of the lab (File .../lab_src/grading.py, in require_check) would say nothing they can act on
        return [f"{type(self).__name__}: {self}"]


# What each visible check did in this kernel: qid -> None (passed) or the check's own message.
_checked: dict[str, str | None] = {}


def record_check(qid: str, error: BaseException | None) -> None:
    if isinstance(error, KeyboardInterrupt):
        _checked[qid] = ("the check was interrupted (under Validate: it ran longer than nbgrader's "
                         "Execute.timeout allows a cell)")
    else:
        _checked[qid] = None if error is None else f"{type(error).__name__}: {error}".strip()


def check_not_passed(qid: str) -> str | None:
    """The message of the visible check of `qid` if it ran in this kernel and failed, else None."""
    return _checked.get(qid)


def require_check(qid: str) -> None:
    """The visible part of a test cell. Under Validate, it fails with the check's own message unless
    the notebook's check passed in this run; otherwise (and while autograding) it only says where the
    score comes from."""
    if autograding():
        return
    if qid not in _checked:
        state = f"{qid}: the check has not run in this kernel: run the notebook from the top."
    elif _checked[qid] is not None:
        state = f"{qid}: the check did not pass.\n{_checked[qid]}"
    else:
        state = None
    if validating() and state:
        lines = wrap(state).splitlines()
        more = [f"... ({len(lines) - 12} more lines: run the notebook to see them all)"] if len(lines) > 12 else []
        raise CheckNotPassed("\n".join(lines[:12] + more))
    print(state or f"{qid}: the check passed. The grader's hidden tests run on your answer cell after you submit.")


def wrap(text: str, width: int = 80) -> str:
    """nbgrader's Validate cuts every line of an error at 87 characters: keep the message within that."""
    import textwrap
    return "\n".join(textwrap.fill(line, width, subsequent_indent="  ") if len(line) > width else line
                     for line in text.splitlines())


def grader_view(qid: str) -> dict | None:
    """The grader's saved run of this student's answer to `qid` (for the timeline cell), if there is one."""
    folder = os.environ.get(GRADER_TIMELINES)
    path = Path(folder) / f"{qid}.json" if folder else None
    if path is None or not path.exists():
        return None
    from lab_src.views.saved import load_view
    return load_view(path)
