# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Q9 · Do the pipelined outputs equal the baseline's?
#
# *Exercise q09 of the pipeline-parallelism lab · 6 points*
#
# A pipelined model is the same function as the unsharded one, computed in pieces, so its outputs should
# match the baseline's up to floating-point rounding. `torch.testing.assert_close` compares with
# tolerances suited to the dtype (for float32, a relative 1.3e-6 and an absolute 1e-5) and explains any
# mismatch.
#
# Only one rank holds outputs: the last stage. The baseline's output covers the whole batch; the
# pipeline's comes as one tensor per micro-batch, in order.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q09`
# is yours: running it defines your function here *and* saves it to `answers/q09_check_outputs.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `check_outputs(outputs, baseline_output, stage)`:
#
# - on a stage that holds no outputs, return `False` without comparing anything;
# - on the stage that holds them, compare *all* micro-batches with the baseline using
#   `torch.testing.assert_close` (which raises `AssertionError` on a mismatch) and return `True`.

# %% nbgrader={"grade": false, "grade_id": "q09_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q09
import torch


def check_outputs(outputs, baseline_output, stage):
    """Compare this stage's pipelined outputs with the baseline's; True if compared."""
    ### BEGIN SOLUTION
    if not stage.is_last_stage:
        return False
    torch.testing.assert_close(torch.cat(outputs), baseline_output)
    return True
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Your Q8 step runs on four `torchrun` ranks; then every rank calls your `check_outputs` on its real
# outputs, and the last rank calls it once more with one number of the last micro-batch changed. A good
# check passes the first time and raises the second.

# %%
report = check("q09")

# %% nbgrader={"grade": true, "grade_id": "q09_hidden", "locked": true, "points": 6, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q09 (6 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q09")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q09")
### END HIDDEN TESTS
