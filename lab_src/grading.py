"""What a hidden-test cell runs inside the notebook while nbgrader autogrades it.

The points of each exercise are decided outside the student's notebook: the grader reads the answer
cell from the submitted notebook, runs its hidden tests in fresh processes, and writes the score into
the gradebook (see grader/autograde.py). Code in the notebook could change anything in its own kernel,
so the cell in the notebook deliberately never passes: if the grader's out-of-process step did not
run, the exercise scores zero rather than full marks.
"""


class AwaitingGrader(Exception):
    pass


def scored_out_of_process(qid: str) -> None:
    raise AwaitingGrader(
        f"{qid} is scored by the grader outside this notebook, not by this cell. Instructors: grade with "
        f"`python -m grader autograde`, which runs nbgrader and then the out-of-process hidden tests.")
