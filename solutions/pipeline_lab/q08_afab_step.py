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
# *Exercise q08 of the pipeline-parallelism lab · 20 points for the code, 4 for the written answer*
#
# Everything comes together here: one training step of a pipeline stage, in the All-Forward-All-Backward
# schedule of Q7. Every micro-batch goes forward through this stage, then every micro-batch goes
# backward, in the same order. Whatever crosses a stage boundary goes through your `pipeline_communicate`
# (Q7); whatever happens inside a stage is `stage.forward` and `stage.backward`. The step is right when
# the pipeline computes what the baseline of Q4 computes: the same outputs and loss on the last stage,
# and on every stage the same gradients for the layers it owns.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# ## Each stage runs its own backward
#
# Autograd records how each tensor was computed, but only inside one process. The activation a stage
# receives is a new tensor filled from a message, with no history, so the last stage's `backward` stops
# at its own input and never reaches the layers of the other stages. Each stage therefore calls the
# backward of its own layers, starting from the gradient of its output that the next stage sent back,
# and hands the gradient of its input on to the previous stage. This is the code your step calls, as
# the lab runs it:

# %%
from lab_src import PipelineStage
from lab_src.views.source import show_source
show_source(PipelineStage.forward, PipelineStage.backward)

# %% [markdown]
# ## Predict, then write
#
# Read the last lines of `backward` and answer for yourself before you write the step:
#
# 1. An activation a stage receives is a fresh tensor, like one you make with `torch.empty`. If nothing
#    changes that, what is `input_tensor.grad` after `backward`? What would the previous stage then
#    receive, and what would stage 0's gradients be?
# 2. Stage 0's input is a batch of token ids. Can it have a gradient? Does stage 0 send anything back?
# 3. `backward` *adds* into the `.grad` of every parameter it reaches. After all micro-batches, what does
#    each `.grad` hold? Should anything happen to the gradients between two micro-batches?
# 4. The baseline's loss is the mean of the output over the *whole* batch; your last stage sees one
#    micro-batch at a time. Which number must it pass to `backward` for each micro-batch, so that the
#    gradients add up to the baseline's? (The written question at the end asks you why.)
#
# If the check disagrees with your predictions, its message names the rank, the micro-batch and the
# likely mistake, and the timeline below it draws what your ranks did.
#
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q08`
# is yours: running it defines your function here *and* saves it to `answers/q08_afab_step.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own. When a check finds a problem, it says so first, and the report stays in `report`.
#
# ## Your task
#
# Write `afab_step(stage, data_iter, num_microbatches)`. Reach your Q7 answer through
# `from lab_src import pipeline_communicate`. The contract, printed from the lab's own code:

# %%
import lab_src
help(lab_src.afab_step)

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
        return logits, sum(loss.item() for loss in outputs)
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
# takes the same time. If the check failed, this is the run that failed: in red, where each rank was
# left waiting, and where a rank raised.

# %%
report.timeline()

# %% [markdown]
# ## Written question (4 points)
#
# Why must each micro-batch's loss be divided by the number of micro-batches `m` before `backward`?
# Explain it with what `backward` does to the gradients over the `m` micro-batches and what the
# baseline computes, and say what goes wrong (on which stages, by how much) when it is not divided.
# Would dividing only the loss your step *returns* be enough?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q08_why_m", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# The baseline's loss is the mean over the whole batch. With `m` micro-batches of equal size (Q2), that
# mean is the average of the micro-batches' means: L = (L_1 + ... + L_m) / m, and since gradients are
# linear, the baseline's gradient is (grad L_1 + ... + grad L_m) / m.
#
# In the pipeline, every stage runs `backward` once per micro-batch, and each run *adds* into `.grad`.
# After the step a parameter holds the sum over micro-batches of the gradient of whatever loss the last
# stage started from. If that loss is L_k / m, the sum is exactly the baseline's gradient. If it is L_k,
# the sum is m times too large, on every stage, because the gradient each stage sends back is scaled
# too: every gradient of the model is m times the baseline's (the check reports "4x ... 4 is the number of
# micro-batches"). The outputs are not affected, only the gradients.
#
# Dividing only the returned loss would make the printed number right and leave every gradient m times
# too large: the scale has to be in the tensor `backward` starts from. (Equivalently one could divide
# the gradients by m after the step; dividing the loss does it in one place.)

# %% nbgrader={"grade": true, "grade_id": "q08_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q08 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q08")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q08")
### END HIDDEN TESTS
