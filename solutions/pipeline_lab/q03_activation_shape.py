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
# The model of this lab is a tiny decoder-style transformer. A micro-batch of token ids goes in; a score
# for every vocabulary entry at every position comes out. In between: an embedding (token and position),
# a stack of transformer blocks, and a head (final norm and projection). A pipeline cuts this chain
# between blocks, and gives the embedding to the first stage and the head to the last.
#
# The drawing below is made from the lab's own model and data: the shapes at both ends are what they
# produce for one micro-batch. Whatever crosses a cut has to be sent by one process and received by
# another, forward and then backward, and a receive with `torch.distributed` needs a buffer of the right
# shape and dtype *before* the data arrives. What goes where the question marks are is this exercise.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src import LabConfig
from lab_src.views.pictures import boundaries_figure
boundaries_figure(LabConfig())

# %% [markdown]
# The pieces a stage can hold, as the lab defines them:

# %%
from lab_src.pipeline.model import Block, Embedding, Head
from lab_src.views.source import show_source
show_source(Embedding.forward, Block.forward, Head.forward)

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q03`
# is yours: running it defines your function here *and* saves it to `answers/q03_activation_shape.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own. When a check finds a problem, it says so first, and the report stays in `report`.
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

# %% [markdown]
# The drawing again, with your answer in it (for the micro-batch size of the lab's configuration):

# %%
cfg = LabConfig()
boundaries_figure(cfg, activation_shape(cfg, cfg.global_batch_size // cfg.num_microbatches))

# %% nbgrader={"grade": true, "grade_id": "q03_hidden", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q03 (5 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q03")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q03")
### END HIDDEN TESTS
