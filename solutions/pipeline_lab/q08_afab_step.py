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
# # Q8 · All-Forward-All-Backward
#
# *Exercise q08 of the pipeline-parallelism lab · 20 points*
#
# Everything comes together here: one training step of a pipeline stage, in the AFAB schedule of Q7.
#
# **Forward phase**, for each micro-batch `mb` in order:
# 1. get the input: `recv_forward` (Q7), or on the first stage a batch of tokens from `data_iter`,
#    moved to `stage.device`;
# 2. `y = stage.forward(x, microbatch=mb)`;
# 3. `send_forward` the output;
# 4. keep `x` and `y` (or, on the last stage, the micro-batch's loss): the backward needs them.
#
# **Backward phase**, for each micro-batch in the same order:
# 1. `recv_backward` the gradient of this stage's output (None on the last stage);
# 2. `stage.backward(x, y, grad, microbatch=mb)` back-propagates through this stage's layers and returns
#    the gradient of `x`;
# 3. `send_backward` that gradient.
#
# Why a stage needs its own backward: autograd's graph stops at the process boundary. The activation a
# stage receives is a fresh tensor with no history, so `loss.backward()` on the last stage cannot reach
# stage 0's weights. Each stage runs the backward of its own piece by hand and passes the gradient of its
# input on.
#
# Three details decide whether your gradients equal the baseline's:
#
# - **Received activations need `requires_grad`.** A received tensor is a leaf that does not require grad;
#   unless you call `x.requires_grad_()` before the forward, backward computes no gradient for it, and
#   nothing reaches the earlier stages. (Token ids on the first stage are integers: no gradient there.)
# - **The loss of a micro-batch.** The baseline's loss is the mean over the whole batch. With `m` equal
#   micro-batches, that is the sum over micro-batches of `output.mean() / m`. Use exactly that loss on
#   the last stage, so that the gradients, summed over micro-batches, are the baseline's.
# - **Gradients accumulate.** Each backward adds into `.grad`; after all micro-batches each parameter holds
#   the sum. Do not zero them in between.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q08`
# is yours: running it defines your function here *and* saves it to `answers/q08_afab_step.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `afab_step(stage, data_iter, num_microbatches)`. Call `pipeline_communicate` through
# `from lab_src import pipeline_communicate` (it finds your Q7 answer). Return `(outputs, loss)`: on the
# last stage the list of each micro-batch's output (detached) and the total loss as a float; on every
# other stage `([], None)`.

# %% nbgrader={"grade": false, "grade_id": "q08_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q08
from lab_src import pipeline_communicate


def afab_step(stage, data_iter, num_microbatches):
    """One All-Forward-All-Backward step of this stage; returns (outputs, loss)."""
    ### BEGIN SOLUTION
    inputs, outputs, logits = [], [], []
    for mb in range(num_microbatches):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        if x is None:                       # first stage: tokens from the dataloader
            x = next(data_iter).to(stage.device)
        else:                               # a received activation: make backward compute its gradient
            x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean() / num_microbatches  # this micro-batch's share of the batch mean
        inputs.append(x)
        outputs.append(y)
    for mb in range(num_microbatches):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        input_grad = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=input_grad, microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(float(loss) for loss in outputs)
    return [], None
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks run your step (8 blocks, 4 micro-batches), then three ranks run it with 7 blocks
# and 2 micro-batches. The check compares the last stage's outputs and loss, and every stage's gradients,
# with the baseline (your Q4), and it checks that the pipeline is real: each rank built and ran only its
# own layers, and the messages are the ones AFAB implies. Below the result: the measured schedule,
# and the bubble next to the theory.

# %%
report = check("q08")

# %% [markdown]
# ## What your code did
#
# Your own run, on a measured time axis: forward and backward boxes per micro-batch, each message an
# arrow from its send to its receive, and the idle time in between. Compare the measured bubble with
# (p-1)/(m+p-1), and switch to the ideal view to see what the schedule alone implies when every stage
# takes the same time.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q08_hidden", "locked": true, "schema_version": 3, "solution": false, "task": false, "points": 20}
# Hidden tests of q08 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q08")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q08")
### END HIDDEN TESTS
