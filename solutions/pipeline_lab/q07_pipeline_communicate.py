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
# # Q7 · The four point-to-point operations
#
# *Exercise q07 of the pipeline-parallelism lab · 15 points for the code, 6 for the written answer*
#
# In the **All-Forward-All-Backward** (AFAB) schedule, every micro-batch first goes forward through all
# stages, then every micro-batch goes backward. The picture below is drawn by the lab's own timeline
# from the schedule as the checks know it (`lab_src/pipeline/schedules.py`), for 4 stages and 4
# micro-batches: each row is one rank, time runs to the right, `F2` is the forward of micro-batch 2 and
# `B2` its backward, the thin bars are sends and receives, and each arrow a message from its send to its
# receive.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.views.pictures import schedule_figure
schedule_figure("afab", p=4, m=4)

# %% [markdown]
# The hatched parts are the **bubble**: time a rank waits for work. With equal stages it is
# (p-1)/(m+p-1) of the step, here 3/7; more micro-batches shrink that share. Between the boxes, stages
# exchange tensors with point-to-point messages. A stage does four kinds of exchange:
#
# | operation | what moves | between |
# |---|---|---|
# | `recv_forward` | the activation this stage's forward needs | from the previous stage |
# | `send_forward` | this stage's output activation | to the next stage |
# | `recv_backward` | the gradient of this stage's output | from the next stage |
# | `send_backward` | the gradient of this stage's input | to the previous stage |
#
# At the ends of the pipeline some of them have no partner. Your function must then do nothing and
# return `None`: that way the same step code (Q8) runs on every stage.

# %% [markdown]
# ## Written question (6 points)
#
# Using the picture above, explain when each of the four operations happens during one AFAB step, on
# which ranks it does nothing, and why the schedule cannot deadlock if every rank performs its
# operations in the order of the picture.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q07_when", "locked": false, "points": 6, "schema_version": 3, "solution": true, "task": false}
# During the forward phase, for each micro-batch k in order, a stage first does `recv_forward(k)` (it
# waits for the activation of micro-batch k from stage r-1), runs its forward, then `send_forward(k)` to
# stage r+1. Stage 0 has no previous stage: its `recv_forward` does nothing and its input comes from the
# dataloader. The last stage has no next stage: its `send_forward` does nothing and its output feeds the
# loss instead.
#
# During the backward phase, for each micro-batch k, a stage does `recv_backward(k)` (the gradient of its
# output from stage r+1), runs backward, then `send_backward(k)`: the gradient of its input to stage r-1.
# The last stage's `recv_backward` does nothing (it starts from its own loss) and stage 0's
# `send_backward` does nothing (its input is token ids, which have no gradient).
#
# Each send on stage r is matched by the receive on its neighbour, for the same micro-batch, in the same
# order on both sides, and the arrows always go from a rank that is already able to send: in the forward
# phase activations only flow from lower to higher ranks, in the backward phase gradients only from higher
# to lower, and stage 0 can start forward without waiting while the last stage can start backward as soon
# as its last forward is done. So some rank can always make progress and nothing waits forever.

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q07`
# is yours: running it defines your function here *and* saves it to `answers/q07_pipeline_communicate.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own. When a check finds a problem, it says so first, and the report stays in `report`.
#
# ## Your task
#
# Write `pipeline_communicate(operation, stage, tensor=None, microbatch=0)`. `stage` is this rank's
# `PipelineStage`; the attributes you need:
#
# - `stage.pp_rank`, `stage.pp_size`, `stage.is_first_stage`, `stage.is_last_stage`
# - `stage.activation_shape`: your Q3 answer for this run;
# - `stage.send(tensor, dst=..., operation=..., microbatch=...)`: send `tensor` to pipeline rank `dst`;
# - `stage.recv(src=..., shape=..., operation=..., microbatch=...)`: receive a tensor of `shape` from
#   pipeline rank `src`, and return it.
#
# Pass `operation` and `microbatch` along: they label the message in the timeline. Return the received
# tensor for the two receives, and `None` for the sends and whenever there is nothing to do. Do not set
# `requires_grad` here; deciding what needs a gradient is Q8's job.

# %% nbgrader={"grade": false, "grade_id": "q07_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q07
def pipeline_communicate(operation, stage, tensor=None, microbatch=0):
    """One point-to-point operation of `stage`, or nothing where it does not apply."""
    ### BEGIN SOLUTION
    if operation == "recv_forward":
        if stage.is_first_stage:
            return None
        return stage.recv(src=stage.pp_rank - 1, shape=stage.activation_shape,
                          operation=operation, microbatch=microbatch)
    if operation == "send_forward":
        if not stage.is_last_stage:
            stage.send(tensor, dst=stage.pp_rank + 1, operation=operation, microbatch=microbatch)
        return None
    if operation == "recv_backward":
        if stage.is_last_stage:
            return None
        return stage.recv(src=stage.pp_rank + 1, shape=stage.activation_shape,
                          operation=operation, microbatch=microbatch)
    if operation == "send_backward":
        if not stage.is_first_stage:
            stage.send(tensor, dst=stage.pp_rank - 1, operation=operation, microbatch=microbatch)
        return None
    raise ValueError(f"unknown operation {operation!r}")
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks call your function in AFAB order, without any model compute: each send carries a
# tensor filled with a label that says who sent it and for which micro-batch, and each receive reports
# what arrived. Then the same with 2 ranks. A mistake shows as a wrong label, or as receives that wait
# for messages no rank is going to send: as soon as every rank waits, the check stops the run and says
# what each rank was waiting for, the cause first.

# %%
report = check("q07")

# %% [markdown]
# ## What your code did
#
# The timeline below is the run you just made (the 4-stage case), drawn from the events every rank
# recorded: each message is an arrow from its send to its receive. Press play, or drag the slider, and
# watch the activations go forward and the gradients come back. Without any compute, the messages are
# all there is. If the check failed, this is the run that failed: in red, where each rank was left
# waiting when the check stopped it, and the messages that no receive took.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q07_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q07 (15 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q07")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q07")
### END HIDDEN TESTS
