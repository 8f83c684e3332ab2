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
# # Q3 · The tensors that travel between stages
#
# *Exercise q03 of the pipeline-parallelism lab · 5 points*
#
# The model of this lab is a tiny decoder-style transformer. A batch of token ids goes in; a score for
# every vocabulary entry at every position comes out:
#
# ```
# tokens (micro_batch, seq)
#    │  embed            token + position embedding        ── first stage only
#    ▼
# (micro_batch, seq, hidden)
#    │  blocks.0 … blocks.L-1   attention + MLP, each keeps the shape
#    ▼
# (micro_batch, seq, hidden)
#    │  head             final norm + projection           ── last stage only
#    ▼
# logits (micro_batch, seq, vocab)
# ```
#
# A pipeline cuts this chain between blocks. Whatever crosses the cut has to be sent by one process and
# received by another, and a receive with `torch.distributed` needs a buffer of the right shape and
# dtype *before* the data arrives. So every stage must know the shape of the tensors it will receive.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q03`
# is yours: running it defines your function here *and* saves it to `answers/q03_activation_shape.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `activation_shape(cfg, micro_batch_size)` that returns the shape, as a tuple of ints, of the tensor
# one stage sends to the next for one micro-batch. `cfg` is a `lab_src.LabConfig`; look at its fields:

# %%
from lab_src import LabConfig
LabConfig()


# %% [markdown]
# Think about:
# - Does the tensor between two blocks depend on the vocabulary size? On the number of layers or heads?
# - The backward pass sends gradients the other way. What shape does the gradient of a tensor have?

# %% nbgrader={"grade": false, "grade_id": "q03_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q03
def activation_shape(cfg, micro_batch_size):
    """Shape of the activation sent between stages for one micro-batch."""
    ### BEGIN SOLUTION
    return (micro_batch_size, cfg.seq_len, cfg.hidden_size)
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks take your shape at its word: rank 0 embeds a micro-batch of real tokens and
# compares the result with your shape; the other ranks feed a tensor of your shape to a transformer block
# and look at what comes out. The last rank also runs the head: its output is what does *not* travel.

# %%
report = check("q03")

# %% nbgrader={"grade": true, "grade_id": "q03_hidden", "locked": true, "schema_version": 3, "solution": false, "task": false, "points": 5}
# Hidden tests of q03 (5 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q03")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q03")
### END HIDDEN TESTS
