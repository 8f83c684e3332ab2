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
# # Q20 · Data parallel: gradient buckets reduced during the 1F1B backward
#
# *Exercise q20 of the pipeline-parallelism lab · 20 points*
#
# In q14 every replica finished its whole step, then all-reduced every gradient: the network worked while
# the processors waited. Real data-parallel libraries (PyTorch's `DistributedDataParallel`, DeepSpeed,
# Megatron) start reducing during the backward. The moment a gradient is final, it can travel. They group
# the parameters into **buckets** of a few megabytes, in the order the backward finishes them (the last
# layer's first), and launch one all-reduce per bucket while the backward goes on with earlier layers.
#
# Under a pipeline, "final" needs care. A 1F1B stage runs the backwards of m micro-batches, and each adds
# into the same `.grad`. A gradient is final only after the stage's **last** backward of the step. Reduce
# earlier and the micro-batches after it are lost: torchrec #4758 armed its reduction on the last forward
# and silently reduced after the wrong backward. Here you write the reducer and place it in your own 1F1B
# step. Its rings are your q19 ring, run in a thread of each rank.
#
# The figure is the schedule model's 1F1B step on 4 stages, with the rings of three buckets drawn in a thin
# row under each stage (its "lane 1", the reducing thread). Each ring starts as the stage's last backward
# finishes that bucket's gradients.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.data_parallel.figure import buckets_figure

buckets_figure(p=4, m=8, buckets=3)

# %% [markdown]
# ## Predict first
#
# The lab's seed course trains an MNIST MLP, 784 → 256 → 128 → 64 → 10 in float32. Its parameters, in
# declaration order: `fc1.weight` 802,816 bytes, `fc1.bias` 1,024, `fc2.weight` 131,072, `fc2.bias` 512,
# `fc3.weight` 32,768, `fc3.bias` 256, `fc4.weight` 2,560, `fc4.bias` 40. **Under the bucket rule of the
# contract below, how many buckets does the MLP make with a cap of 1 MiB, of 512 KiB, and of 64 KiB?**
# Which of those plans reduces fc4's gradient earliest, and which sends fewest messages?
#
# Write the three numbers in `predicted_buckets()` in the answer cell before you write the reducer, as
#
#     return {"1MiB": ..., "512KiB": ..., "64KiB": ...}
#
# each the number of buckets under that cap. They are graded, and only the exact count is right. The check
# builds your Reducer on that MLP under the same three caps and prints each plan beside your number, right or
# wrong.
#
# <details><summary><b>Hint</b>: the rule, by hand (open it if you are stuck)</summary>
#
# Walk the list from the end (`fc4.bias` first), adding up bytes. Close the bucket just before the
# parameter that would take it over the cap. A parameter larger than the cap goes alone.
# </details>

# %% [markdown]
# ## Your task
#
# Two pieces in one answer cell.
#
# **`class Reducer`**, built once by the lab as `Reducer(stage, dp, cap_bytes)`, before the first step:
# - `self.buckets`: the plan, a list of lists of parameter names. Take the parameters that need a
#   gradient, in reverse declaration order (`stage.named_parameters()` reversed). Each joins the open
#   bucket while the bucket stays within `cap_bytes` bytes of gradients. One larger than the cap goes
#   alone. Frozen parameters (`requires_grad` False) go in no bucket.
# - Hooks: `param.register_post_accumulate_grad_hook(hook)` calls `hook(param)` each time a backward has
#   added into `param.grad`. Once the reducer is **armed**, that gradient is final. When every parameter of
#   a bucket is final, launch the bucket: flatten its gradients into one buffer and call
#   `dp.launch(buffer)`. It returns a handle at once, and the rank's reducing thread sums the buffer over
#   the data-parallel group with your q19 `ring_all_reduce`. Launch in the plan's order (a bucket goes
#   when it and every bucket before it are full), so that every replica's k-th ring carries the same bucket.
# - `arm()`: from now on, the hooks launch. Before it, they do nothing.
# - `finish()`: wait for every launched bucket (`handle.wait()`), write its sum divided by `dp.size` back into
#   each parameter's `.grad`, and disarm. Average each gradient exactly once.
# - Tied embeddings (the token embedding of the first stage and the output projection of the last share one
#   weight; each stage holds a copy, `stage.tied_embedding`, None on the others): each copy's gradient is its
#   own use's. At the end of `finish()`, once every bucket is written back, sum it over the replica's first and
#   last stage with `dp.sum_tied(grad)`, so that both copies hold the whole gradient.
#
# **`bucketed_step(stage, data_iter, num_microbatches, reducer)`**: your q12 step, with two more calls.
# Call `reducer.arm()` just before the stage's last backward of the step, and `reducer.finish()` before
# returning. The lab builds the grid of q14 for you: the groups, each replica's stage and its shard of the data.
#
# The whole contract: `help(lab_src.exercises.bucketed_step)`. The grader runs 2 × 2, 1 × 4 and 4 × 1 grids
# (data × pipeline), m = 4 and 8 micro-batches, tied embeddings on one of them, and three optimizer steps. It compares every gradient of every
# replica with one process's, and every bucket plan against the rule (yours, on each stage and on the seed's
# MLP). From the record of every launch it checks one ring per bucket per step, and no launch before the
# stage's last backward. On the last stage, whose last backward is the step's first to end, a bucket must
# launch before that backward ends: the ring overlaps the cool-down of the stages before it.
#
# <details><summary><b>Hint</b>: finished, but not launched (open it if you are stuck)</summary>
#
# A hook fires once per parameter per backward, in whatever order autograd finishes them. Count, per
# bucket, how many of its parameters are final; then launch from the first bucket not yet launched, as
# long as the buckets are full. Keep each bucket's buffer and handle: `finish` needs them.
# </details>
#
# <details><summary><b>Hint</b>: the numbers are m times too large, or some micro-batches are missing (open it if you are stuck)</summary>
#
# Armed from the start, the hooks fire in every micro-batch's backward, and each bucket is reduced m times.
# Armed on the last *forward*, a stage in its warm-up still has backwards to run; the buckets leave with
# some micro-batches' gradients missing, and what those backwards add later is never averaged.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q20_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q20
import torch

from lab_src import p2p_communicate


def predicted_buckets():
    """How many buckets the seed's MLP makes under each cap (numbers only)."""
    # return {"1MiB": ..., "512KiB": ..., "64KiB": ...} with a number for each
    ### BEGIN SOLUTION
    return {"1MiB": 1, "512KiB": 2, "64KiB": 4}
    ### END SOLUTION


class Reducer:
    def __init__(self, stage, dp, cap_bytes):
        ### BEGIN SOLUTION
        self.dp = dp
        params = [(name, p) for name, p in stage.named_parameters() if p.requires_grad]
        self.params = dict(params)
        self.buckets, current, size = [], [], 0
        for name, p in reversed(params):              # the order a backward finishes them
            nbytes = p.numel() * p.element_size()
            if current and size + nbytes > cap_bytes:
                self.buckets.append(current)
                current, size = [], 0
            current.append(name)
            size += nbytes
        if current:
            self.buckets.append(current)
        self.bucket_of = {name: k for k, bucket in enumerate(self.buckets) for name in bucket}
        self.tied = getattr(stage, "tied_embedding", None)   # the first and last stage's shared weight, if tied
        for name, p in params:
            p.register_post_accumulate_grad_hook(lambda p, name=name: self._final(name))
        self.armed = False
        self._reset()
        ### END SOLUTION

    ### BEGIN SOLUTION
    def _reset(self):
        self.ready = [0] * len(self.buckets)
        self.next = 0                                 # the first bucket not launched yet
        self.launched = []                            # (names, buffer, handle)

    def _final(self, name):
        if not self.armed:
            return
        self.ready[self.bucket_of[name]] += 1
        while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
            names = self.buckets[self.next]
            buffer = torch.cat([self.params[n].grad.reshape(-1) for n in names])
            self.launched.append((names, buffer, self.dp.launch(buffer)))
            self.next += 1
    ### END SOLUTION

    def arm(self):
        ### BEGIN SOLUTION
        self.armed = True
        ### END SOLUTION

    def finish(self):
        ### BEGIN SOLUTION
        if self.next < len(self.buckets):
            raise RuntimeError(f"finish(): bucket {self.next} ({', '.join(self.buckets[self.next])}) never filled "
                               f"after arm(): was the reducer armed before the stage's last backward?")
        for names, buffer, handle in self.launched:
            handle.wait()
            buffer /= self.dp.size
            offset = 0
            for n in names:
                grad = self.params[n].grad
                grad.copy_(buffer[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()
        if self.tied is not None:                     # after the buckets: their write-back would undo the sum
            self.dp.sum_tied(self.tied.grad)
        self.armed = False
        self._reset()
        ### END SOLUTION


def bucketed_step(stage, data_iter, num_microbatches, reducer):
    """Your q12 step, with reducer.arm() before the last backward and reducer.finish() at the end."""
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
            outputs[mb] = y.mean() / m
            losses.append(float(outputs[mb].detach()))
        return y

    def backward(mb, grad):
        if mb == m - 1:                          # the stage's last backward: after it, every gradient is final
            reducer.arm()
        return stage.backward(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)

    for mb in range(warmup):
        x = p2p_communicate("recv_forward", stage, microbatch=mb)
        y = forward(mb, x)
        p2p_communicate("send_forward", stage, tensor=y, microbatch=mb)
    x = p2p_communicate("recv_forward", stage, microbatch=warmup) if warmup < m else None
    for i in range(m - warmup):
        mb = warmup + i
        y = forward(mb, x)
        grad = p2p_communicate("send_forward_recv_backward", stage, tensor=y, microbatch=mb, recv_microbatch=i)
        input_grad = backward(i, grad)
        if i == m - warmup - 1:
            p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=i)
        else:
            x = p2p_communicate("send_backward_recv_forward", stage, tensor=input_grad, microbatch=i,
                                recv_microbatch=mb + 1)
    for mb in range(m - warmup, m):
        grad = p2p_communicate("recv_backward", stage, microbatch=mb)
        input_grad = backward(mb, grad)
        p2p_communicate("send_backward", stage, tensor=input_grad, microbatch=mb)
    reducer.finish()
    if stage.is_last_stage:
        return logits, sum(losses)
    return [], None
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs your reducer and step on a 2 × 2 grid (4 real processes, gloo on the CPU): two replicas of a
# 2-stage pipeline, m = 4, two optimizer steps, a cap of 40,000 bytes that makes several buckets per stage.
# It compares every gradient with one process's, then prints, per rank, the plan's bucket sizes, the rings
# launched in each step, the backward the first ring started in, and how long `finish` waited after the
# stage's last backward (the reduction the backward did not hide; measured on this machine, so it varies from
# run to run). Then come your Reducer's plans for the seed's MLP, each beside your prediction, right or wrong.

# %%
report = check("q20")

# %% [markdown]
# ## What your code did
#
# Every operation of every rank in its last step, on a measured time axis. The thin row under each rank is its
# reducing thread: your ring's messages, bucket after bucket. On which stage does the first ring begin,
# and what is that stage doing while its rings run? On stage 0, how long after the last ring ends does the
# step end?

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q20_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q20 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q20")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q20")
### END HIDDEN TESTS
