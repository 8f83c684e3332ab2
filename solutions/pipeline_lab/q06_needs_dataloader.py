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
# # Q6 · Which ranks need the training dataloader?
#
# *Exercise q06 of the pipeline-parallelism lab · 5 points*
#
# In data parallelism every rank reads its own batches. In a pipeline that is not so: most stages never
# see a token. They receive activations from the stage before them in the forward pass, and gradients from
# the stage after them in the backward pass.
#
# A dataloader costs memory, worker processes and file handles, so a pipeline creates one only on the
# ranks that consume its batches. Look at the model picture in Q3 and at what each stage's input is.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q06`
# is yours: running it defines your function here *and* saves it to `answers/q06_needs_dataloader.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `needs_dataloader(pp_rank, pp_size)` that returns `True` when stage `pp_rank` must read batches
# from the training dataloader in *this* lab, and `False` otherwise.
#
# *Think further (not graded):* with a real language-modelling loss, the last stage would need the
# labels (the next tokens) to compute the loss. What would change then?

# %% nbgrader={"grade": false, "grade_id": "q06_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q06
def needs_dataloader(pp_rank, pp_size):
    """True when stage pp_rank of pp_size reads batches from the dataloader."""
    ### BEGIN SOLUTION
    return pp_rank == 0
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks build their stages and feed each one what your answer implies: a batch of tokens
# from the dataloader where you said it needs one, otherwise an activation as the previous stage would
# send it. A stage given the wrong kind of input says so.

# %%
report = check("q06")

# %% nbgrader={"grade": true, "grade_id": "q06_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q06 (5 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q06")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q06")
### END HIDDEN TESTS
