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
# # Q12 · One-Forward-One-Backward
#
# *Exercise q12 of the pipeline-parallelism lab · 20 points*
#
# Your AFAB step (Q8) computes the right gradients, but every rank keeps the activations of *all* m
# micro-batches until the backward phase begins: memory grows with m, and m is exactly what you raise to
# shrink the bubble. One-Forward-One-Backward (1F1B) runs the same forwards and backwards in another
# order, so that a rank frees a micro-batch's activations soon after it made them. Drawn from the lab's
# schedule model (4 stages, 8 micro-batches; under each schedule, the micro-batches each rank holds):

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.views.schedule_figure import schedule_figure

schedule_figure(("afab", "1f1b"), p=4, m=8)

# %% [markdown]
# Each rank's step has three parts:
#
# 1. **Warm-up**: forwards only. The last stage needs none: it can start the backward of a micro-batch
#    right after its forward. Each earlier stage must run a few more forwards before the first gradient
#    can come back to it. How many on rank r, with p stages and m micro-batches, is for you to work out
#    from the picture; the rule to keep is that rank r never holds more than min(p − r, m) micro-batches
#    whose backward has not run.
# 2. **Steady state**: one forward, then one backward, and again, until every forward has run. This is
#    where Q11's combined operations come in: after a forward, `send_forward_recv_backward` sends the
#    output and brings back the gradient of the *oldest* micro-batch still waiting; after that backward,
#    `send_backward_recv_forward` sends its input gradient and brings the *next* activation.
# 3. **Cool-down**: the backwards of the micro-batches still waiting, as their gradients arrive.
#
# The arithmetic of Q8 is unchanged: the loss of a micro-batch is `output.mean() / m` on the last
# stage, gradients accumulate in `.grad`, and the same micro-batches go forward and backward. Only the
# order changes, so outputs, loss and gradients must equal the baseline's exactly as Q8's did.
#
# Keep the micro-batches straight: the forward of micro-batch k and its backward happen at different
# times, so keep each micro-batch's input and output (or loss) until its backward, and pass each call
# the micro-batch it works on (`microbatch=`, and `recv_microbatch=` for the combined operations).
# Activations you receive from Q11's `recv_forward` already require grad.

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q12`
# is yours: running it defines your function here *and* saves it to `answers/q12_one_f_one_b_step.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `one_f_one_b_step(stage, data_iter, num_microbatches)`, with `from lab_src import p2p_communicate`
# (your Q11) for every message, `stage.forward` and `stage.backward`. Return what `afab_step` returns:
# on the last stage the list of each micro-batch's output (detached, in micro-batch order) and the total
# loss as a float; on every other stage `([], None)`.
#
# **Predict, then run (graded).** Before you run anything, fill in `predicted_warmup()` at the end of the
# answer cell: how many warm-up forwards each rank runs with p = 4 stages, for m = 8 micro-batches (the
# picture above) and for m = 2 (fewer micro-batches than stages, where the picture cannot help you). One
# entry per rank and m, `"m8_rank0"` to `"m8_rank3"` and `"m2_rank0"` to `"m2_rank3"`, numbers only: the
# grader reads them without running your code, and the check says whether they match what 1F1B does.

# %% nbgrader={"grade": false, "grade_id": "q12_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q12
from lab_src import p2p_communicate


def one_f_one_b_step(stage, data_iter, num_microbatches):
    """One One-Forward-One-Backward step of this stage; returns (outputs, loss)."""
    ### BEGIN SOLUTION
    m = num_microbatches
    warmup = min(stage.pp_size - stage.pp_rank - 1, m)
    inputs, outputs, logits, losses = {}, {}, [], []

    def forward(mb, x):
        if x is None:                            # first stage: tokens from the dataloader
            x = next(data_iter).to(stage.device)
        y = stage.forward(x, microbatch=mb)
        inputs[mb], outputs[mb] = x, y
        if stage.is_last_stage:
            logits.append(y.detach())
            outputs[mb] = y.mean() / m           # this micro-batch's share of the batch mean
            losses.append(float(outputs[mb].detach()))
        return y

    def backward(mb, grad):
        return stage.backward(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)

    for mb in range(warmup):                     # warm-up: forwards only
        x = p2p_communicate("recv_forward", stage, microbatch=mb)
        y = forward(mb, x)
        p2p_communicate("send_forward", stage, tensor=y, microbatch=mb)
    x = p2p_communicate("recv_forward", stage, microbatch=warmup) if warmup < m else None
    for i in range(m - warmup):                  # steady state: one forward, one backward
        mb = warmup + i
        y = forward(mb, x)
        grad = p2p_communicate("send_forward_recv_backward", stage, tensor=y, microbatch=mb, recv_microbatch=i)
        input_grad = backward(i, grad)
        if i == m - warmup - 1:                  # the last forward has run: nothing more to receive
            p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=i)
        else:
            x = p2p_communicate("send_backward_recv_forward", stage, tensor=input_grad, microbatch=i,
                                recv_microbatch=mb + 1)
    for mb in range(m - warmup, m):              # cool-down: the backwards still waiting
        grad = p2p_communicate("recv_backward", stage, microbatch=mb)
        input_grad = backward(mb, grad)
        p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(losses)
    return [], None
    ### END SOLUTION


def predicted_warmup():
    """p = 4 stages: the warm-up forwards of each rank for m = 8 and for m = 2 micro-batches (numbers only)."""
    ### BEGIN SOLUTION
    return {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,
            "m2_rank0": 2, "m2_rank1": 2, "m2_rank2": 1, "m2_rank3": 0}
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks run your step with 8 micro-batches, then three ranks with 7 uneven blocks and 2
# micro-batches. The check compares the last stage's outputs and loss and every stage's gradients with
# the baseline (your Q4), checks that the pipeline is real, and reads 1F1B's rules from what each rank
# recorded: no rank holds more than min(p − r, m) micro-batches awaiting their backward, and each rank
# runs 1F1B's order. It also prints how many micro-batches each rank held at most, and the peak bytes of
# activations it kept for backward, and last whether your `predicted_warmup()` matches 1F1B's warm-ups.

# %%
report = check("q12")

# %% [markdown]
# ## What your code did
#
# Your 4-stage run, with a memory lane under the ranks: the bytes each rank holds for its backwards,
# counted as your step ran (every tensor autograd saves for a backward, until that backward frees it).
# Play it and watch each rank's memory climb through its warm-up and then stay level.

# %%
report.timeline()

# %% [markdown]
# ## Memory against the number of micro-batches
#
# Now your two steps side by side: your AFAB step (Q8) and your 1F1B step, each on 4 stages of the small
# model with m = 4, 8, 16, 32 and 64 micro-batches of 2 samples. Each point is the most bytes one rank held
# for backward during the step (a `torch.autograd.graph.saved_tensors_hooks` counts what autograd saves
# and when it lets go).

# %%
from lab_src.checks.experiments import memory_vs_microbatches

runs = memory_vs_microbatches()
runs.figure() if runs else None

# %% [markdown]
# AFAB's lines rise in proportion to m: every rank holds all m micro-batches when its last forward ends.
# 1F1B's stay flat once m reaches p − r on rank r: rank 0 holds 4 micro-batches, rank 3 one, however many
# follow. (The ranks differ in how much *one* micro-batch costs: rank 0 also holds the embedding's
# activations, the last rank the head's.)
#
# ## 1000 micro-batches
#
# A course on pipeline parallelism asks for "at least 1000 micro-batches with 4 stages without going out of
# memory". With 1F1B that is a matter of time, not memory. The next cell runs your step with m = 8 and m =
# 1000 and compares what each rank held (on 2 CPU cores about a minute: 33 to 69 s in six runs under load).

# %%
from lab_src.checks.experiments import thousand_microbatches

thousand_microbatches(1000)     # with the memory study's runs above, if you ran it: AFAB's line at m = 1000

# %% [markdown]
# ## The bubble, explored
#
# Memory was one reason to raise m; the bubble is the other. With every stage equally fast and messages
# free, a step of AFAB or 1F1B takes m + p − 1 slots of forward-and-backward work per rank, of which each
# rank is busy for m: the idle share is (p − 1)/(m + p − 1). With m = 1 the pipeline degenerates into
# **naive model parallelism**: one stage works while the others wait, and the bubble is (p − 1)/p.
#
# The check's small model is the wrong place to measure this: its layers take about as long as a message
# between two processes, so the waiting for messages, not the schedule, dominates its idle time (your Q8
# check printed a bubble far above the formula). The DEMO model below is large enough that a layer's
# compute dominates a message. The cell runs your 1F1B step on it, on 4 ranks, with its batch of 32 samples
# cut into m = 1, 2, 4, 8 and 16 micro-batches (under a minute on 2 CPU cores), and prints two bubbles for
# each run:
#
# - **emulated compute**: your run replayed, each rank's operations in the order it ran them and each
#   receive waiting for its send, with every forward and backward box given the median length of its kind
#   in this run and every message a fixed small price. It is the idle time your *schedule* makes, whatever
#   else the machine runs.
# - **measured**: the wall clock of the same run. On a hub the 4 ranks share 2 cores: a rank that waits
#   for a core counts as busy, and a box that waited for one is longer.

# %%
from lab_src.checks.experiments import bubble_vs_microbatches

bubbles = bubble_vs_microbatches()
bubbles.figure() if bubbles else None

# %% [markdown]
# The emulated bubble follows the formula at every m, within half a point (its messages are not free): 75 % at
# m = 1, 27.5 % at m = 8, in every run, since it depends on your step's order and not on the machine. The
# measured one follows it while a micro-batch's compute is large (about 75 % at m = 1, 55–60 % at m = 2) and
# leaves it as m grows (at m = 4 and 8, from 8 points below it to 14 above), differently from run to run:
# besides the schedule it pays each message's latency, the Python of every call, and 4 processes on 2 cores,
# and how long a rank waits for a core depends on whatever else the machine runs. The batch is fixed here (32
# samples), so a larger m means smaller micro-batches: at m = 16 each holds 2 samples, its compute shrinks
# towards the cost of a message, and the measured bubble rises above the formula's 15.8 %, by an amount the
# load decides: between 23 % and 37 % in six runs on a 2-core machine shared with other work (load average 7
# to 12; 22 % and 25 % in earlier ones). Your measured column is one more draw; run the cell again and it
# moves.
#
# The check's small model lives in that regime all the time: a layer's compute there is about as short as
# a message between two processes, so every stage waits on messages as long as it computes, and the
# bubble the checks print is far above (p − 1)/(m + p − 1). A schedule removes the *schedule's* idle time;
# it does nothing about messages that cost as much as the work between them.

# %% [markdown]
# Your own step from that study, the run with m = 8, measured and, with the toggle, with emulated compute:
# the emulated view shows the schedule itself (warm-up, the alternation of the steady state, the
# cool-down), and the memory lane under each shows every rank levelling off after its warm-up. In the
# measured view the same order is there, with boxes stretched wherever a rank waited for a core.

# %%
bubbles.timeline(8) if bubbles else None

# %% [markdown]
# ## The production API
#
# `torch.distributed.pipelining` ships this schedule as `Schedule1F1B`: you wrap each rank's modules in
# its `PipelineStage`, and the schedule object does the warm-up, the steady state, the cool-down and the
# messages. The next cell runs it on the stages your answers build (the same DEMO model, 8 micro-batches)
# and draws its timeline under your step's, with each rank's order beside yours (a few seconds).

# %%
from lab_src.checks.torch_bridge import torch_bridge

bridge = torch_bridge()      # beside your m = 8 run of the bubble study above, if you ran it
bridge.figure() if bridge else None

# %% nbgrader={"grade": true, "grade_id": "q12_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q12 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q12")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q12")
### END HIDDEN TESTS
