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
# runs it on its own.
#
# ## Your task
#
# Write `check_args(num_layers, num_stages, global_batch_size, num_microbatches, allow_uneven_layers=False)`:
#
# - raise `ValueError` if `num_stages < 1` or `num_microbatches < 1`;
# - raise `ValueError` if the layers do not divide evenly into the stages, unless `allow_uneven_layers`
#   is true: then only require that every stage gets at least one layer;
# - raise `ValueError` if the global batch does not divide evenly into `num_microbatches`;
# - otherwise return the micro-batch size, `global_batch_size // num_microbatches`.
#
# Use `raise ValueError(...)` rather than `assert`: `python -O` removes assert statements, and a
# configuration check must not disappear. Make each message say what is wrong.

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
# The check tries a few configurations in this notebook, then starts 4 `torchrun` ranks that each
# validate the lab's default configuration before doing anything else, as a real pipeline program would.

# %%
report = check("q02")

# %% nbgrader={"grade": true, "grade_id": "q02_hidden", "locked": true, "schema_version": 3, "solution": false, "task": false, "points": 5}
# Hidden tests of q02 (5 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q02")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q02")
### END HIDDEN TESTS
