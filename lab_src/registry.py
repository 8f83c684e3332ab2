"""The ten exercises, by ID. Every file that belongs to exercise qNN carries "qNN" in its name:

    notebooks/pipeline_lab/qNN_<function>.ipynb      the student notebook (generated release)
    solutions/pipeline_lab/qNN_<function>.ipynb      its source: reference answer, visible and hidden tests
    lab_src/exercises.py  @exercise("qNN")           the stub and its contract (signature, docstring)
    answers/qNN_<function>.py                        the student's answer, written by the %%answer cell
    grader/checks/qNN_<function>.py                  the hidden tests the grader runs out of process
"""
from __future__ import annotations

from dataclasses import dataclass

ASSIGNMENT = "pipeline_lab"


@dataclass(frozen=True)
class Exercise:
    id: str                  # "q05"
    function: str            # the function the student writes ("" for q01: written answers only)
    title: str               # one line for headings and messages
    needs: tuple[str, ...]   # other exercises whose answers this one's checks run

    @property
    def notebook(self) -> str:
        return f"{self.id}_{self.function or 'seeds'}.ipynb"

    @property
    def answer_file(self) -> str:
        return f"{self.id}_{self.function}.py"

    @property
    def answer_cell(self) -> str:
        """nbgrader grade_id of the solution cell holding the answer."""
        return f"{self.id}_answer"

    @property
    def hidden_cell(self) -> str:
        """nbgrader grade_id of the hidden-test cell that carries the autograded points."""
        return f"{self.id}_hidden"


EXERCISES: dict[str, Exercise] = {e.id: e for e in [
    Exercise("q01", "", "Seeds across pipeline, data and tensor parallel ranks", ()),
    Exercise("q02", "check_args", "Argument checks: stages and micro-batches", ()),
    Exercise("q03", "activation_shape", "The tensors that travel between stages", ("q02",)),
    Exercise("q04", "baseline_step", "Baseline forward and backward of the whole model", ()),
    Exercise("q05", "distribute_layers", "Which layers each stage owns", ("q02", "q03")),
    Exercise("q06", "needs_dataloader", "Which ranks need the training dataloader", ("q02", "q03", "q05")),
    Exercise("q07", "pipeline_communicate", "The four point-to-point operations", ("q02", "q03", "q05")),
    Exercise("q08", "afab_step", "All-Forward-All-Backward", ("q02", "q03", "q04", "q05", "q06", "q07")),
    Exercise("q09", "check_outputs", "Pipelined outputs equal the baseline",
             ("q02", "q03", "q04", "q05", "q06", "q07", "q08")),
    Exercise("q10", "check_gradients", "Each stage's gradients equal the baseline",
             ("q02", "q03", "q04", "q05", "q06", "q07", "q08")),
]}

CODED = [e for e in EXERCISES.values() if e.function]


def exercise(qid: str) -> Exercise:
    try:
        return EXERCISES[qid.lower()]
    except KeyError:
        raise KeyError(f"no exercise {qid!r}; the exercises are {', '.join(EXERCISES)}") from None
