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
# So far the pipeline has run one step, on random tokens, with a stand-in loss (the mean of the output).
# That was enough to show that the pipelined gradients equal the unsharded model's. The claim that
# matters to anyone who trains a model is stronger: cutting the model into stages changes *where* the
# work happens, not *what* is computed, so a pipeline learns exactly as the whole model in one process
# would. Same seed, same batches, same optimizer: the same loss at every step, and the same model at the
# end.
#
# In this notebook your pipeline trains for real and you check that claim yourself: a real data set, a
# real loss with real labels, an optimizer on every stage, a held-out evaluation, and the two learning
# curves on one figure.
#
# ### The data: handwritten digits, no download
#
# scikit-learn ships a small data set of 1,797 handwritten digits: 8x8 pixels, each one of 17 grey
# levels (0 to 16). It lives inside the scikit-learn package, so it works on a machine without network
# (many course hubs have none), and it is small enough that two CPU cores train a classifier on it in
# minutes. The lab reads it in `lab_src.topics.training.digits`:
#
# - an image becomes a sequence of 64 tokens, its pixels row by row; a token is a grey level, so the
#   vocabulary has 17 entries and the model of the earlier notebooks is used unchanged;
# - the class scores are the scores of tokens 0 to 9, averaged over the 64 positions;
# - 360 images are held out (always the same ones) and never trained on; the training images are
#   visited in an order drawn from the run seed, a new order every epoch.
#
# ### Where the labels go
#
# The loss needs two things: the model's output, which only exists on the **last** stage, and the
# labels. Every other stage only passes activations on. So the last stage must get the labels, and
# there are two ways:
#
# 1. the first stage reads the batch and sends the labels down the pipeline with the activations: an
#    extra message per micro-batch through every stage, to stages that do nothing with it;
# 2. the last stage reads the labels itself, from the same data, in the same order, as the first stage
#    reads the pixels.
#
# Large training systems do the second: both ends of the pipeline read from the data, each the part it
# needs (Q6's question now has two answers: the first stage for the inputs, the last for the labels).
# Here the data object gives both: `data.train_tokens(step)` and `data.train_labels(step)` return the
# step's micro-batches, micro-batch `k` of one belonging to micro-batch `k` of the other.
#
# The stage you get is a `ClassifierStage`. Its last stage ends in the loss: after
# `stage.set_labels(labels)`, its forward of micro-batch `k` returns each image's cross-entropy against
# label micro-batch `k`. Your Q8 step takes `output.mean() / num_microbatches` as a micro-batch's loss,
# and the mean of those per-image losses *is* the micro-batch's cross-entropy: the step trains on the
# real loss without a single change. With `stage.set_labels(None)` the last stage returns the ten class
# scores instead, which is what an evaluation wants.
#
# ### An optimizer per stage
#
# Each rank holds only its own layers, so each rank has its own optimizer over `stage.parameters()`,
# and nothing else. AdamW updates every parameter from that parameter's own gradient and running
# averages, so the stages need no communication to update: when the step has returned, every rank's
# gradients are complete (the backward pass brought them), and `optimizer.step()` runs on each rank on
# its own. (Clipping gradients by their global norm would be different: the norm sums over every
# stage's gradients, which takes an all-reduce over the pipeline group. Not part of this exercise.)
#
# ### When to zero the gradients
#
# Inside a step, gradients *must* accumulate: each micro-batch's backward adds its share into `.grad`,
# and only the sum is the batch's gradient. Between steps they must *not*: the next step starts from
# zero. So zero once per step, before the step runs (not between its micro-batches, not between the
# backward and the update).
#
# ### The loss you report, and the evaluation
#
# Only the last stage knows the loss; it is what the step returns there. After training, the held-out
# images go **forward only** through the pipeline: `stage.eval()` (layers such as dropout behave
# differently when evaluating; this model has none, but the habit matters), `torch.no_grad()` (no graph
# is kept for a backward that will never come), and for each micro-batch `recv_forward`, `forward`,
# `send_forward`, as in the first half of the AFAB step. The last stage compares the class scores with
# the labels.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q13`
# is yours: running it defines your function here *and* saves it to `answers/q13_train_pipeline.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `train_pipeline(stage, data, step_fn, num_steps, lr)`, which every rank runs at the same time: train
# this rank's stage for `num_steps` steps with AdamW at learning rate `lr` (PyTorch's other defaults), each
# step running `step_fn(stage, data_iter, data.num_microbatches)` (your Q8 step) on step k's batch, then
# evaluate the trained pipeline on the held-out images. The contract:
#
# - the pipeline learns exactly as the whole model in one process would, on the same batches: the same loss
#   at every step (to rounding);
# - each rank reads from `data` only what its stage needs (the sections above say who needs what), and
#   updates only its own parameters;
# - the evaluation is forward only (eval mode, no autograd), through the pipeline, over
#   `data.num_test_microbatches` held-out micro-batches, with your Q7's `from lab_src import
#   pipeline_communicate` for its messages; the stage is back in training mode afterwards;
# - on the last stage, return `{"losses": [...], "test_loss": ..., "test_accuracy": ...}`: the loss of every
#   step (floats), the mean held-out cross-entropy, and the share of held-out images whose highest score is
#   their label; on every other stage, `None`.
#
# <details><summary><b>Hint</b>: the loop, step by step (open it if you are stuck)</summary>
#
# - One `torch.optim.AdamW(stage.parameters(), lr=lr)`, made once.
# - For each step `k` in `range(num_steps)`: zero the gradients; on the first stage make an iterator over
#   `data.train_tokens(k)`; on the last stage call `stage.set_labels(data.train_labels(k))`; run
#   `step_fn(stage, tokens, data.num_microbatches)` (it returns `(outputs, loss)`, and the loss is a float on
#   the last stage); then `optimizer.step()`.
# - The evaluation: `stage.eval()`, `torch.no_grad()`, the first stage reading `data.test_tokens()`, the last
#   `data.test_labels()` after `stage.set_labels(None)` (so that its forward returns class scores); for each
#   held-out micro-batch `recv_forward`, `forward`, `send_forward`; `torch.nn.functional.cross_entropy` for the
#   loss. Then `stage.train()`.
#
# </details>

# %% nbgrader={"grade": false, "grade_id": "q13_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q13
import torch
import torch.nn.functional as F

from lab_src import pipeline_communicate


def train_pipeline(stage, data, step_fn, num_steps, lr):
    """Train this stage for num_steps steps, then evaluate on the held-out images."""
    ### BEGIN SOLUTION
    optimizer = torch.optim.AdamW(stage.parameters(), lr=lr)   # this stage's parameters, and only those
    losses = []
    stage.train()
    for step in range(num_steps):
        optimizer.zero_grad()                                  # before the step: its backwards accumulate
        tokens = iter(data.train_tokens(step)) if stage.is_first_stage else None
        if stage.is_last_stage:
            stage.set_labels(data.train_labels(step))          # the loss is computed here
        _, loss = step_fn(stage, tokens, data.num_microbatches)
        optimizer.step()
        if stage.is_last_stage:
            losses.append(loss)

    stage.eval()                                               # evaluation: forward only, no graph
    tokens = data.test_tokens() if stage.is_first_stage else None
    labels = data.test_labels() if stage.is_last_stage else None
    if stage.is_last_stage:
        stage.set_labels(None)                                 # the last stage returns class scores
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for mb in range(data.num_test_microbatches):
            x = pipeline_communicate("recv_forward", stage, microbatch=mb)
            if x is None:
                x = tokens[mb].to(stage.device)
            y = stage.forward(x, microbatch=mb)
            pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
            if stage.is_last_stage:
                target = labels[mb].to(y.device)
                test_loss += float(F.cross_entropy(y, target))
                correct += int((y.argmax(dim=-1) == target).sum())
    stage.flush()
    stage.train()
    if not stage.is_last_stage:
        return None
    n = data.num_test_microbatches
    return {"losses": losses, "test_loss": test_loss / n, "test_accuracy": correct / (n * data.micro_batch_size)}
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks run your training loop around your Q8 step: 30 steps of 32 images in 4
# micro-batches, AdamW with learning rate 0.01, then the held-out evaluation. In this notebook the whole
# model trains on the same batches from the same seed, in one process. The check then asks:
#
# - **the same curve**: at every step, the pipeline's loss equals the single process's to a relative
#   1e-5. In float32 the two differ only by rounding: the pipeline adds the gradients of 4 micro-batches,
#   the single process computes the batch at once, and the sums round differently, by a few units in the
#   last place (about 1e-7). Any real mistake in the loop shows up a thousand times larger;
# - **learning**: the mean loss of the last 5 steps is at least 10 % below that of the first 5;
# - **a real pipeline**: each rank built and ran only its own layers, every step's messages and order are
#   the schedule's (AFAB), the evaluation is forward only, the tokens were read on the first stage and the
#   labels on the last, and only the last stage reported;
# - **the same model**: the held-out loss and accuracy equal the single-process model's, evaluated in eval
#   mode without autograd.
#
# The figure shows both curves (the pipeline's as dots on the single process's line) and, below, their
# relative difference at each step. The lab's instructors have a longer run (`make train` in the lab's
# repository, which the student release does not include: a few minutes, about 90 % held-out accuracy). Its
# figure shows something the 30 steps here do not: the step-by-step agreement lasts about 60 steps. Training amplifies tiny differences, so the rounding
# differences of the first steps (1e-7) grow until, after a hundred steps or so, the two runs follow
# different paths, at the same level of loss and accuracy. Any two float32 runs whose sums add up in
# another order part ways like this; what the pipeline must not change is the computation itself.

# %%
report = check("q13")

# %% nbgrader={"grade": true, "grade_id": "q13_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q13 (15 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q13")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q13")
### END HIDDEN TESTS
