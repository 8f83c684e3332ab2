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
# # Q11 · Point-to-point messages with `torch.distributed`
#
# *Exercise q11 of the pipeline-parallelism lab · 15 points for the code, 6 for the written answer*
#
# So far your stages exchanged tensors through `stage.send` and `stage.recv`, which the lab wrote for you.
# Here you write the messages yourself, with the calls real pipeline code uses, and you write the ones
# the next schedule needs. Below are two schedules of the same step, drawn from the lab's schedule
# model: 4 stages, 8 micro-batches, every layer equally expensive, messages free. Under each, the number
# of micro-batches each rank holds while their backward has not run yet (their activations stay in memory
# until then).

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.views.schedule_figure import schedule_figure

schedule_figure(("afab", "1f1b"), p=4, m=8)

# %% [markdown]
# **All-Forward-All-Backward** (AFAB, Q8) runs every forward before any backward, so every rank holds all
# 8 micro-batches at its peak. **One-Forward-One-Backward** (1F1B, Q12) starts the backward of a
# micro-batch as soon as it can: after a short *warm-up* of forwards, each rank alternates one forward and
# one backward (the *steady state*), then finishes the remaining backwards (the *cool-down*). Rank r then
# never holds more than p − r micro-batches: 4, 3, 2, 1. The bubble is the same; the memory is not.
#
# Look at the steady state of rank 1: it finishes a forward, sends the output to rank 2 and immediately
# needs a gradient *from rank 2*; right after its backward it sends a gradient to rank 0 and needs the
# next activation *from rank 0*. Meanwhile its neighbours do the mirror image. Two neighbours that both
# have something to send to each other at the same moment: that is new, and it is where the order of
# the calls starts to matter.
#
# ## The calls
#
# `torch.distributed` has three ways to move one tensor between two processes:
#
# | call | returns | when it returns |
# |---|---|---|
# | `dist.send(t, group=g, group_dst=k)`, `dist.recv(buf, group=g, group_src=k)` | — | when the message is through: a send waits until the peer receives it |
# | `dist.isend(...)`, `dist.irecv(...)` | a request | at once; `request.wait()` waits for the message |
# | `dist.batch_isend_irecv([dist.P2POp(dist.isend, t, group=g, group_peer=k), dist.P2POp(dist.irecv, buf, group=g, group_peer=k), ...])` | a list of requests | at once, all operations posted together; wait for each request |
#
# A receive needs a buffer of the right shape, dtype and device before anything arrives: it writes into
# the tensor you give it. A received *activation* must also require grad: the stage's backward computes
# the gradient of its input from it, to send to the previous stage (a gradient needs no gradient of its
# own). Peers are pipeline ranks within the stage's process group: `group=stage.group, group_peer=...`.
#
# Your function handles six operations. The four of Q7, and two combined ones for the steady state:
#
# | operation | sends | receives | neighbour | no-op on |
# |---|---|---|---|---|
# | `recv_forward` | | activation of `microbatch` | previous | first stage |
# | `send_forward` | `tensor` (activation of `microbatch`) | | next | last stage |
# | `recv_backward` | | gradient of `microbatch` | next | last stage |
# | `send_backward` | `tensor` (gradient of `microbatch`) | | previous | first stage |
# | `send_forward_recv_backward` | `tensor` (activation of `microbatch`) | gradient of `recv_microbatch` | next | last stage |
# | `send_backward_recv_forward` | `tensor` (gradient of `microbatch`) | activation of `recv_microbatch` | previous | first stage |
#
# `microbatch` and `recv_microbatch` are only labels: the check records each message under them.

# %% [markdown]
# ## An experiment: blocking sends in the steady state
#
# Before writing yours, run the combined operations written the obvious way, with blocking calls: send
# first, then receive.
#
# ```python
# # first the send: it returns once the peer has received the tensor
# dist.send(tensor.detach(), group=stage.group, group_dst=peer)
# # then the receive, into a new buffer
# buffer = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device, requires_grad=...)
# dist.recv(buffer, group=stage.group, group_src=peer)
# ```
#
# Two ranks call these in the order of a 1F1B step with 4 micro-batches (rank 0 warms up with one
# forward; rank 1, the last stage, with none). It needs your answers to Q2, Q3 and Q5, which build the
# stages, not yours to Q11.
#
# **Predict first (graded).** The run gets stuck: each rank ends up inside a send that never returns.
# Before you run it, work out from the schedule above *which micro-batch's message* each rank is stuck
# sending, and write it in `predicted_deadlock()` in the answer cell below, as
# `return {"rank 0": ..., "rank 1": ...}` with numbers. It is read from your answer cell without running
# it. Then run the experiment: it says what each rank finished and where each one was left waiting.

# %%
from lab_src.checks.q11_p2p_communicate import blocking_demo
demo = blocking_demo()

# %% [markdown]
# The run drawn: the messages that went through, and where each rank waits (the bar that never ends).

# %%
demo.timeline() if demo else None

# %% [markdown]
# ## Written question (6 points)
#
# Using the report above: why do two neighbouring stages that each make a blocking send before their
# receive wait forever in the steady state of 1F1B, and why do the same two messages go through when
# each rank posts its send and its receive together (`dist.batch_isend_irecv`) and only then waits?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q11_deadlock", "locked": false, "points": 6, "schema_version": 3, "solution": true, "task": false}
# In the steady state, rank 0 has just finished the forward of micro-batch 1 and calls
# `send_forward_recv_backward`: it sends that activation to rank 1 and then wants the gradient of
# micro-batch 0 back. Rank 1, at the same moment, has finished the backward of micro-batch 0 and calls
# `send_backward_recv_forward`: it sends that gradient to rank 0 and then wants the activation of
# micro-batch 1. A blocking send returns only when the peer has taken the message (with gloo, the
# sender waits until the receiver has posted a matching receive). Rank 0 is inside its send and has not
# posted its receive yet; rank 1 is inside its own send and has not posted its receive either. Each waits
# for the other to reach a receive that it will only reach after its own send returns: a cycle of waits,
# so neither can ever proceed. The report shows exactly that: both ranks wait in a send, to each other.
#
# With `batch_isend_irecv`, each rank posts both operations before waiting for either: rank 0's receive
# for the gradient is already posted when rank 1's gradient arrives, and rank 1's receive for the
# activation is already posted when rank 0's activation arrives. Both messages have a receiver waiting,
# both complete, and the waits return. Posting the pair together removes the order between one rank's
# send and its receive, which is what created the cycle; the messages in each direction still pair up in
# the order they were posted.

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q11`
# is yours: running it defines your function here *and* saves it to `answers/q11_p2p_communicate.py` next to this notebook.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports): the grader
# runs it on its own.
#
# ## Your task
#
# Write `p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None)` with
# `torch.distributed` only (no `stage.send` / `stage.recv`). What you need of `stage`:
#
# - `stage.pp_rank`, `stage.pp_size`, `stage.is_first_stage`, `stage.is_last_stage`;
# - `stage.group`: the process group of the pipeline, where peers are pipeline ranks;
# - `stage.activation_shape` (your Q3 answer), `stage.dtype`, `stage.device`: what a receive buffer is.
#
# The goal: every operation of the two tables above, in any order the schedules call them, moves its
# messages without two neighbours ever waiting on each other, and returns the received tensor (`None`
# when it only sends, or at an end of the pipeline where it has no neighbour). A received activation
# requires grad; what you send is data, not the graph. The check below says which call went wrong, and
# how. Also fill in `predicted_deadlock()`, your prediction for the experiment above.
#
# <details><summary>Hint: the steps, if you are stuck</summary>
#
# For each operation: find the neighbour, or return `None` at the end of the pipeline where there is
# none; make the receive buffer (`torch.empty` with the activation shape, dtype and device, and
# `requires_grad=True` for an activation); build a `dist.P2POp` for each message; post them together with
# one `dist.batch_isend_irecv` and call `wait()` on every request it returns (before that, the buffer may
# still be empty); return the buffer. Send `tensor.detach()`. The direction comes from the tables above:
# `recv_backward` talks to the *next* stage although its name says "backward".
# </details>

# %% nbgrader={"grade": false, "grade_id": "q11_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q11
import torch
import torch.distributed as dist


def predicted_deadlock():
    """The micro-batch of the message each rank of the blocking-sends experiment is stuck sending."""
    ### BEGIN SOLUTION
    return {"rank 0": 1, "rank 1": 0}
    ### END SOLUTION


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    """One point-to-point operation (or a combined pair) of `stage`, with torch.distributed."""
    ### BEGIN SOLUTION
    towards_next = ("send_forward", "recv_backward", "send_forward_recv_backward")
    towards_previous = ("recv_forward", "send_backward", "send_backward_recv_forward")
    if operation not in towards_next + towards_previous:
        raise ValueError(f"unknown operation {operation!r}")
    to_next = operation in towards_next
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None                                    # no neighbour on that side: nothing to do
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    ops, received = [], None
    if operation.startswith("send"):
        ops.append(dist.P2POp(dist.isend, tensor.detach().contiguous(), group=stage.group, group_peer=peer))
    if "recv" in operation:
        # an activation must require grad: this stage's backward computes the gradient of its input
        received = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device,
                               requires_grad=operation.endswith("recv_forward"))
        ops.append(dist.P2POp(dist.irecv, received, group=stage.group, group_peer=peer))
    for request in dist.batch_isend_irecv(ops):       # posted together: neither waits for the other
        request.wait()
    return received
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks call your function in the order of a 1F1B step with 6 micro-batches, with no
# model compute: each send carries a tensor filled with a label that says who sent it and for which
# micro-batch, and each receive reports what arrived and how its buffer was made. Then two ranks, in 1F1B
# order and in AFAB order (the four single operations). Your `torch.distributed` calls are recorded as
# they happen, so a mistake shows as a wrong label, a missing message, or a receive that waits until its
# timeout, with what every rank was waiting for.

# %%
report = check("q11")

# %% [markdown]
# ## What your code did
#
# The 4-stage run, drawn from the messages your calls made: each arrow goes from a send to its receive.
# In the steady state, see the two messages of a combined operation leave and arrive together.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q11_hidden", "locked": true, "points": 15, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q11 (15 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q11")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q11")
### END HIDDEN TESTS
