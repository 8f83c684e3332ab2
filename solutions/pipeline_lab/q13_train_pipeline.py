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
# # Q13 · Train it: a real loss, an optimizer, one process's learning curve
#
# *Exercise q13 of the pipeline-parallelism lab · 15 points*
#
# TODO: what this step of pipeline parallelism is, and why.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# ## Your task
#
# TODO: the contract of `train_pipeline` (see lab_src/exercises.py).

# %% nbgrader={"grade": false, "grade_id": "q13_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q13
def train_pipeline():
    ### BEGIN SOLUTION
    raise NotImplementedError()
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# TODO: what the check runs and what it shows.

# %%
report = check("q13")

# %% nbgrader={"grade": true, "grade_id": "q13_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q13 (15 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q13")
### END HIDDEN TESTS
