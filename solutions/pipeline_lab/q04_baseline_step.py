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
# # Q4 · The baseline: the whole model, one step
#
# *Exercise q04 of the pipeline-parallelism lab · 10 points*
#
# How do you know a pipelined model computes the right thing? Compare it with the model that is not
# pipelined. The **baseline** runs the whole model on the whole batch in one process: one forward, one
# backward. Later notebooks compare the pipeline's outputs and every gradient with it.
#
# There are no labels in this lab, so the loss is a stand-in: the mean of the model's output. Any scalar
# that depends on every output would do; what matters is that the pipeline computes the same one.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q04`
# is yours: running it defines your function here *and* saves it to `answers/q04_baseline_step.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own. When a check finds a problem, it says so first, and the report stays in `report`.
#
# ## Your task
#
# `baseline_step` is the reference every later notebook is judged against: one training step of the whole
# model, in one process, on one batch. Its contract, printed from the lab's own code:

# %%
import lab_src
help(lab_src.baseline_step)

# %% [markdown]
# **Predict first**, then write the function:
#
# - The pipeline of Q8 will cut *one* global batch into micro-batches. Which batch must the baseline
#   use so that the two can be compared sample by sample, and what happens to the comparison if it uses
#   another one?
# - After your function returns, where are the gradients? Nothing returns them: what did `backward`
#   leave behind, and on which objects?
# - If the loss were `output.sum()` instead of `output.mean()`, by what factor would every gradient
#   change? (The output has shape `(batch, seq, vocab)`.) Would the pipeline still be able to match it?

# %% nbgrader={"grade": false, "grade_id": "q04_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q04
def baseline_step(model, dataloader, device):
    """Forward and backward of the whole model on the first batch; returns (output, loss)."""
    ### BEGIN SOLUTION
    batch = next(iter(dataloader)).to(device)
    output = model(batch)
    loss = output.mean()
    loss.backward()
    return output, loss
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs your function on a freshly built model in float64, looks at the output's shape and the
# loss, and compares one gradient entry with a finite difference: nudge one weight up and down and see how
# the loss moves (no autograd involved, so it tells you whether your gradients belong to your loss). Then
# two `torchrun` ranks run your baseline too: built from the same seed, they must agree with this notebook
# to the last bit (Q1).

# %%
report = check("q04")

# %% nbgrader={"grade": true, "grade_id": "q04_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q04 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q04")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q04")
### END HIDDEN TESTS
