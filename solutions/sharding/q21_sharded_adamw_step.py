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
# # Q21 · Sharding the training state: AdamW and the gradients over the data-parallel ranks (ZeRO-1/2)
#
# *Exercise q21 of the pipeline-parallelism lab · 20 points*
#
# Data parallelism copies the whole training state onto every rank. In float32 that is the parameters, their
# gradients, and AdamW's two moments (`exp_avg`, `exp_avg_sq`): four times the parameters' bytes, on every
# rank. Yet after the all-reduce every rank takes exactly the same optimizer step. ZeRO (Rajbhandari et al.,
# 2020) removes that repetition. **ZeRO-1** gives each of the n ranks one shard of the optimizer's state, so a
# rank steps only its 1/n of the parameters and then shares the result. **ZeRO-2** shards the reduced
# gradients too: a rank needs the sum of its own shard only.
#
# Your q19 ring already has both halves. Its **reduce-scatter** leaves each rank one chunk of the sum: exactly
# the shard of the gradient it needs. Its **all-gather** then spreads the updated parameters. Together they
# send as many bytes as one all-reduce, yet each rank holds only 1/n of the optimizer state. The figure
# shows what each rank holds under plain data parallelism. The ZeRO stages come in the same picture after
# your check, once you have made your prediction.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.sharding.figure import zero_figure

zero_figure(n=4, stages=1)

# %% [markdown]
# ## Predict first
#
# The lab's default model (`LabConfig()`: 8 blocks of hidden size 32) has 106,368 parameters in float32. On
# n = 4 data-parallel ranks, with AdamW, **how many bytes of training state (parameters + gradients + both
# moments) does each rank hold after a step under plain data parallelism (`"dp"`), under ZeRO-1
# (`"zero1"`), and under ZeRO-2 (`"zero2"`, counting the gradient's shard)?** And **how many bytes does
# each rank send per step under ZeRO-2** (`"sent"`), against the 2(n - 1)/n of an all-reduce? Write the four
# numbers in `predicted_bytes()` before you write the step, as
#
#     return {"dp": ..., "zero1": ..., "zero2": ..., "sent": ...}
#
# They are graded: right within half a percent. The check prints each number as right or wrong, beside the
# figure it is judged against.
#
# <details><summary><b>Hint</b>: counting (open it if you are stuck)</summary>
#
# Count in units of the parameters' bytes, P = 4 × 106,368. Plain data parallelism holds P + P + 2P. Which of
# the three bands does each ZeRO stage cut to 1/n? For the traffic, a reduce-scatter sends (n - 1)/n of the
# tensor from each rank, and so does an all-gather.
# </details>

# %% [markdown]
# ## Your task
#
# Write `sharded_adamw_step(params, dp, state, lr, betas, eps, weight_decay)`: one AdamW step of this rank's
# parameters, with AdamW's settings as `torch.optim.AdamW` takes them. Every rank of the data-parallel group calls
# it at once, under `torch.no_grad()`, with its replica's copy of the same parameters. Each `.grad` holds that
# replica's own gradient.
#
# - **The flat vector.** Flatten the parameters, in order, into one vector of N elements. Its n = `dp.size`
#   shards are `torch.tensor_split`'s (uneven sizes: the first N % n shards are one element longer); rank
#   `dp.rank` owns shard `dp.rank`.
# - **Reduce-scatter** the flat gradient in a ring over `dp.group`: the first half of your q19 ring, with the
#   chunks arranged so that each rank ends with its own shard of the sum. Divide by n.
# - **AdamW on the shard**, as `torch.optim.AdamW(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)` does
#   it (decoupled: `p *= 1 - lr * weight_decay` first). The defaults in the signature are torch's; the check and
#   the grader pass others too, as another course's tests or a training would. Keep your state in `state`, a dict
#   that the lab hands back at every call (empty at the first): the moments of your shard only, and the step count.
#   Your parameters are held to one process's AdamW within rtol 1e-5 plus 1% of lr per step: torch updates the
#   first moment with `m.lerp_(g, 1 - b1)`, which differs from `m.mul_(b1).add_(g, alpha=1 - b1)` in the last bit;
#   either passes.
# - **All-gather** the updated shards in a ring (the second half of q19's), and write the flat vector back
#   into the parameters.
# - **Free** the gradients: `p.grad = None` for every parameter.
#
# Use point-to-point messages only, to the next position and from the previous one, as in q19. The whole
# contract: `help(lab_src.exercises.sharded_adamw_step)`. The grader runs n = 2 and 4 data-parallel ranks and
# a 2 × 2 grid (data × pipeline: each stage's replicas form a group of their own), with sizes that do not
# divide by n, in float32 and float64, for three steps after each replica's 1F1B step. It compares every
# replica's parameters with one process's `torch.optim.AdamW`. It measures the bytes of tensors your `state`
# holds against one shard's moments, checks that no gradient is left held, and reads every message.
#
# <details><summary><b>Hint</b>: which chunk, when (open it if you are stuck)</summary>
#
# In q19 the reduce-scatter left rank r with chunk r + 1. Shift it by one: in step s (0 to n - 2), rank r
# sends chunk (r - s - 1) mod n and adds what arrives into chunk (r - s - 2) mod n. In the all-gather, rank r
# sends chunk (r - s) mod n and receives chunk (r - s - 1) mod n. Check it by hand for n = 2.
# </details>
#
# <details><summary><b>Hint</b>: AdamW, one tensor at a time (open it if you are stuck)</summary>
#
# With t the step count after incrementing: `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g²`, then
# `p -= lr / (1 - b1^t) · m / (sqrt(v) / sqrt(1 - b2^t) + eps)`. The weight decay multiplies p by
# (1 - lr · wd) before all that, and never touches g.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q21_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q21
import math

import torch
import torch.distributed as dist


def predicted_bytes():
    """n = 4, the default model's 106,368 float32 parameters: bytes held per rank, and sent per step."""
    # return {"dp": ..., "zero1": ..., "zero2": ..., "sent": ...} with a number for each
    ### BEGIN SOLUTION
    # P = 4 x 106,368 = 425,472 B; dp 4P, ZeRO-1 2P + 2P/4, ZeRO-2 P + 3P/4; sent 2(n - 1)/n P
    return {"dp": 1_701_888, "zero1": 1_063_680, "zero2": 744_576, "sent": 638_208}
    ### END SOLUTION


def sharded_adamw_step(params, dp, state, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    ### BEGIN SOLUTION
    n, me = dp.size, dp.rank
    right, left = (me + 1) % n, (me - 1) % n

    def exchange(send, recv):
        ops = [dist.P2POp(dist.isend, send, group=dp.group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=dp.group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    grads = list(torch.tensor_split(torch.cat([p.grad.reshape(-1) for p in params]), n))
    for s in range(n - 1):                        # reduce-scatter: rank me ends with the whole of chunk me
        received = torch.empty_like(grads[(me - s - 2) % n])
        exchange(grads[(me - s - 1) % n], received)
        grads[(me - s - 2) % n] += received
    g = grads[me] / n
    for p in params:
        p.grad = None

    flat = torch.cat([p.reshape(-1) for p in params])
    shards = list(torch.tensor_split(flat, n))
    mine = shards[me]
    if not state:
        state.update(step=0, exp_avg=torch.zeros_like(mine), exp_avg_sq=torch.zeros_like(mine))
    (b1, b2), wd = betas, weight_decay
    state["step"] += 1
    t = state["step"]
    mine.mul_(1 - lr * wd)
    state["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
    state["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
    denom = (state["exp_avg_sq"].sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
    mine.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - b1 ** t))

    for s in range(n - 1):                        # all-gather: pass the updated shards round
        received = torch.empty_like(shards[(me - s - 1) % n])
        exchange(shards[(me - s) % n], received)
        shards[(me - s - 1) % n].copy_(received)
    offset = 0
    for p in params:
        p.copy_(flat[offset:offset + p.numel()].view_as(p))
        offset += p.numel()
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs your step on 4 data-parallel ranks, on a model whose 29,949 parameters do not divide by 4,
# then on a 2 × 2 grid (two replicas of a 2-stage pipeline; each stage's two replicas form a group). Each runs
# three steps, each after the replica's 1F1B step. Per rank it prints the bytes your `state` holds beside one
# shard's moments and the whole state's, the bytes sent per step beside 2(n - 1)/n of the parameters, and
# whether the parameters equal one process's AdamW. Then it prints each number of your prediction, right or
# wrong, beside the default model's figure.

# %%
report = check("q21")

# %% [markdown]
# ## What your code did
#
# The 4-rank run, its three steps: each rank's 1F1B step (one stage: forwards and backwards only), then your
# reduce-scatter and all-gather, message after message. How long does the optimizer step take against the
# forward and backward, and which half of the ring carries which tensor?
#
# Under the timeline, the memory lane stacks what each rank holds when each of its operations ends: the
# parameters, the activations saved for the backward, the gradients in `.grad`, and the tensors your `state`
# holds (the temporaries your ring works in are not counted). Before you look: how tall is your state's band
# against the parameters' band, and where does the gradients' band end?
#
# Here the gradients are whole until your step runs: the 1F1B step accumulates them over the micro-batches, and
# only then does your reduce-scatter cut them to a shard. What this ZeRO-2 saves is what stays after the step.
# DeepSpeed's ZeRO-2 never holds them whole: it reduce-scatters buckets during the backward, as q20's buckets do.

# %%
report.timeline()

# %% [markdown]
# ## The stages side by side
#
# The opening figure again, now with the three ZeRO stages under plain data parallelism. Each band is the
# parameters', the gradients' or the moments' bytes, whole or a 1/n shard. Compare it with your prediction,
# and with the memory lane above: which row is your step?

# %%
zero_figure(n=4)

# %% nbgrader={"grade": true, "grade_id": "q21_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q21 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q21")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q21")
### END HIDDEN TESTS
