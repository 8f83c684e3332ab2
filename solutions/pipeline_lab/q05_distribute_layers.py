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
# # Q5 · Which layers does each stage own?
#
# *Exercise q05 of the pipeline-parallelism lab · 10 points*
#
# A pipeline stage is a contiguous slice of the model. With 8 blocks on 4 stages:
#
# ```
#            stage 0              stage 1         stage 2         stage 3
# tokens ─▶ [embed b0 b1] ─────▶ [b2 b3] ─────▶ [b4 b5] ─────▶ [b6 b7 head] ─▶ logits
# ```
#
# The embedding lives on the first stage and the head on the last; the blocks are what gets distributed.
# Each rank builds a `lab_src.PipelineStage`, which asks `distribute_layers` which blocks it owns and
# builds only those, so a rank never holds the memory of the whole model.
#
# When the blocks do not divide evenly (the course's Q2 check forbids it, but real models and this lab's
# grader allow it), give the extra blocks to the earlier stages: 7 blocks on 3 stages become 3, 2, 2.
# (The first stage also owns the embedding; in a real model you might instead give it fewer blocks.)

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q05`
# is yours: running it defines your function here *and* saves it to `answers/q05_distribute_layers.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `distribute_layers(num_layers, pp_rank, pp_size)` that returns the list of block indices that
# stage `pp_rank` (0-based) of `pp_size` owns, in increasing order:
#
# - consecutive stages own consecutive blocks, and together they own every block exactly once;
# - stage sizes differ by at most one block, the earlier stages taking the extra ones.

# %% nbgrader={"grade": false, "grade_id": "q05_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q05
def distribute_layers(num_layers, pp_rank, pp_size):
    """Indices of the blocks that stage pp_rank of pp_size owns."""
    ### BEGIN SOLUTION
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    count = base + (1 if pp_rank < extra else 0)
    return list(range(start, start + count))
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks each build their `PipelineStage` from your function (8 blocks), then three ranks do
# the same with 7 blocks. The check looks at what each rank actually built.

# %%
report = check("q05")

# %% nbgrader={"grade": true, "grade_id": "q05_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q05 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q05")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q05")
### END HIDDEN TESTS
