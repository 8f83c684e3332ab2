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
# # Q2 · Argument checks: stages and micro-batches
#
# *Exercise q02 of the pipeline-parallelism lab · 5 points*
#
# A pipeline runs at the pace of its slowest stage: while one stage is busy, the next waits for its
# output. So the layers should be spread evenly, and the simplest rule is that the number of layers
# divides evenly by the number of stages.
#
# Pipelines also split each batch into **micro-batches**, so that stage 0 can start on micro-batch 1
# while stage 1 works on micro-batch 0. The batch must split into equal micro-batches: every micro-batch
# then has the same shape, which is what lets a stage allocate the buffer for the next message before the
# message arrives (Q3), and it keeps the loss scaling simple (Q8).
#
# Before building anything, a pipeline program should refuse a configuration that breaks these rules,
# with a message that says which rule.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q02`
# is yours: running it defines your function here *and* saves it to `answers/q02_check_args.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own. When a check finds a problem, it says so first, and the report stays in `report`.
#
# ## Your task
#
# `check_args` is the first thing a pipeline program calls: it refuses a configuration that the
# pipeline cannot run evenly, and otherwise says how large each micro-batch is. Its contract, printed
# from the lab's own code:

# %%
import lab_src
help(lab_src.check_args)

# %% [markdown]
# **Predict first.** For each call below, write down what it should do (return what, or refuse, and
# because of which rule) before you write any code. The check runs the same calls, so you can compare.
#
# | call | returns, or refuses because ... |
# |---|---|
# | `check_args(8, 2, 12, 3)` | |
# | `check_args(8, 3, 8, 4)` | |
# | `check_args(7, 3, 8, 4, allow_uneven_layers=True)` | |
# | `check_args(2, 3, 6, 3, allow_uneven_layers=True)` | |
# | `check_args(8, 4, 8, 3)` | |
# | `check_args(8, 4, 8, 0)` | |
#
# Two more things to decide: which rules involve the stages and which the micro-batches (can a
# configuration break both?), and how to refuse so that the refusal happens in *every* way Python can
# be run, including with optimisations switched on.

# %% nbgrader={"grade": false, "grade_id": "q02_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q02
def check_args(num_layers, num_stages, global_batch_size, num_microbatches, allow_uneven_layers=False):
    """Validate a pipeline configuration; return the micro-batch size."""
    ### BEGIN SOLUTION
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be at least 1, got {num_microbatches}")
    if allow_uneven_layers:
        if num_layers < num_stages:
            raise ValueError(f"{num_layers} layers cannot give each of {num_stages} stages at least one")
    elif num_layers % num_stages != 0:
        raise ValueError(f"{num_layers} layers do not divide evenly into {num_stages} stages")
    if global_batch_size % num_microbatches != 0:
        raise ValueError(f"a batch of {global_batch_size} does not split into {num_microbatches} "
                         f"equal micro-batches")
    return global_batch_size // num_microbatches
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check tries the calls of the table in this notebook (and two more), then starts 4 `torchrun`
# ranks that each validate the lab's default configuration before doing anything else, as a real
# pipeline program would. Where your function disagrees, the message says what it expected and why.

# %%
report = check("q02")

# %% nbgrader={"grade": true, "grade_id": "q02_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q02 (5 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q02")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q02")
### END HIDDEN TESTS
