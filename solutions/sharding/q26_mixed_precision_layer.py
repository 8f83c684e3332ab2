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
# # Q26 · Mixed precision in the sharded step: float32 master shards, bf16 gathers, fp16 loss scaling
#
# *Exercise q26 of the pipeline-parallelism lab · 20 points*
#
# In q22 every rank keeps 1/n of each block's weights and gathers the whole block just before it runs. Those
# gathers are most of FSDP's traffic, and the block's matmuls are most of its time. Both get cheaper in a
# lower precision: bfloat16 (8 bits of mantissa, float32's range) or float16 (11 bits of mantissa, a range
# that ends at 65,504). Training entirely in bf16 does not work, though: the small updates an optimizer makes
# are lost against the weights they are added to. So the weights are kept twice over. The **master copy**
# stays in float32, sharded as in q22, and the optimizer steps it. A cast in the compute dtype is what
# travels and what computes. That is FSDP2's `MixedPrecisionPolicy(param_dtype=torch.bfloat16,
# reduce_dtype=torch.float32)`.
#
# The figure shows one block's step on one rank. Each box is a tensor or an operation, coloured by the dtype it
# is in.

# %%
# %load_ext lab_src
import torch

from lab_src.checks import check
from lab_src.topics.mixed_precision.figure import dtype_figure

dtype_figure()

# %% [markdown]
# ## Why not bf16 everywhere, and why fp16 needs a loss scale
#
# Two small facts decide the design. Both are computed here, live.

# %%
one = torch.tensor(1.0)
print("float32 : 1 + 1e-3 =", (one + 1e-3).item())
print("bfloat16: 1 + 1e-3 =", (one.bfloat16() + torch.tensor(1e-3).bfloat16()).item(),
      "(the update is lost: bf16 keeps 8 bits of mantissa, its ulp at 1 is 2^-7 = 0.0078)")
print("float16 : 1e-8 ->", torch.tensor(1e-8).half().item(),
      "(underflows: float16's smallest subnormal is 2^-24 = 6e-8)")
print("float16 : 1e-8 x 2^16 ->", (torch.tensor(1e-8) * 2**16).half().item(), "(scaled first, it survives)")

# %% [markdown]
# An SGD update of lr × g = 1e-3 on a weight near 1 vanishes in a bf16 master copy. A float32 master keeps
# it, because float32 has 24 bits of mantissa. In float16, a gradient of 1e-8 becomes 0 before any update is
# made. Multiplying the loss by a large **scale** (2^16) shifts every gradient up into float16's range. The
# optimizer divides by the scale again (in float32), before its step. When the scale is so large that
# something overflows to inf, the step is skipped and the scale halved. After a run of clean steps it is
# doubled again. That is `torch.amp.GradScaler`.
#
# ## Predict first
#
# A block of the lab's default model (hidden size 32) has 12,704 parameters. A stage holds 8 such blocks,
# sharded over n = 4 data-parallel ranks, computed in bfloat16. Before you write the layer, answer:
#
# - `"gather"`: how many bytes does one block's gathered weights hold, as the gather returns them?
# - `"master"`: how many bytes does a rank's float32 master copy of the 8 blocks hold (its shards)?
# - `"bf16_only"`: how many bytes would the same shards hold if they were kept in bfloat16 alone?
#
# Write the three numbers in `predicted_mixed_bytes()`, as
#
#     return {"gather": ..., "master": ..., "bf16_only": ...}
#
# They are graded: right within half a percent. The check prints each one as right or wrong.

# %% [markdown]
# ## Your task
#
# Write `mixed_precision_layer(layer, dp, compute_dtype)`, q22's layer with a float32 master and a lower
# compute dtype, and the class `LossScaler`, in the same answer cell.
#
# **The layer.** It returns an `nn.Module` that stands for `layer`, one transformer block.
#
# - It holds `self.shard`: an `nn.Parameter` in **float32**. This is shard `dp.rank` of the block's
#   parameters flattened in `named_parameters()` order, as `torch.tensor_split` cuts them (as in q22). Free
#   the block's own parameters.
# - **Forward:** the weights travel in the compute dtype. `dp.all_gather` must be given the shard already cast
#   to `compute_dtype`, so the gather carries half of float32's bytes. The block runs in `compute_dtype`, on
#   the input cast to `compute_dtype`. The output is returned in **float32**: the lab computes the loss in
#   float32, and the next block casts again.
# - **Backward:** gather again in `compute_dtype` and compute the gradients in `compute_dtype`. The block's
#   input gets its gradient in float32. The flat weight gradient is cast to **float32 before**
#   `dp.reduce_scatter`: the replicas' gradients are summed in float32. Divide by `dp.size`; the result is the
#   shard's gradient, float32.
#
# `dp` is q22's group (on your q19 ring) with one addition: `dp.all_reduce(t)` sums a tensor over the group,
# in place. The lab's `torch.optim.SGD` steps the float32 shards.
#
# **The scaler**, for float16: `LossScaler(dp, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
# growth_interval=2000)`, used as torch's GradScaler is:
#
#     scaler.scale(loss).backward()
#     scaler.step(optimizer)      # unscale the gradients; skip the optimizer's step if any is inf or NaN
#     scaler.update()             # x0.5 after a skipped step; x2 after growth_interval clean steps in a row
#     scaler.get_scale()          # the scale now, a float
#
# Each rank holds only its shard's gradient. An inf in one rank's shard must therefore make **every** rank
# skip, or the replicas' weights stop agreeing. The lab passes a smaller `growth_interval` in some cases, so
# that growth shows within a few steps.
#
# The whole contract: `help(lab_src.exercises.mixed_precision_layer)`. The grader runs 2 and 4 ranks, in
# bf16 and in fp16, with blocks whose parameters do not divide by n. In the fp16 cases the lab puts an inf into
# one rank's shard gradient at one step. It compares every step with one process computing the same casts.
# It reads the bytes of every gather and reduce-scatter from what your ring carried, and checks the dtypes the
# shard and its gradient are kept in. In fp16 it follows the scale, step by step.
#
# <details><summary><b>Hint</b>: where the casts go (open it if you are stuck)</summary>
#
# Start from your q22 layer. `dp.all_gather(self.shard.detach().to(compute_dtype))` gathers the cast. Use
# `x.to(compute_dtype)` for the input and `y.float()` for the output. In the backward,
# `torch.autograd.grad(y, (x_in, full), grad_y.to(y.dtype))` gives both gradients in `compute_dtype`. Apply
# `.float()` to each: the flat one before `dp.reduce_scatter`, the input's before it is returned.
# </details>
#
# <details><summary><b>Hint</b>: one verdict for the whole group (open it if you are stuck)</summary>
#
# In `step`, multiply every gradient of `optimizer.param_groups` by 1 / scale. Then set a flag to 1.0 if any
# of them is not finite, `dp.all_reduce` the flag, and step only if the sum is 0. Keep the result for
# `update`.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q26_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q26
import torch
from torch import nn
from torch.func import functional_call


def predicted_mixed_bytes():
    """8 blocks of 12,704 parameters on 4 ranks, bf16: a gather, a rank's float32 master, the same in bf16."""
    # return {"gather": ..., "master": ..., "bf16_only": ...} with a number for each
    ### BEGIN SOLUTION
    # a gather holds the whole block at 2 bytes a parameter; a rank keeps 8 x 12,704 / 4 parameters
    return {"gather": 12_704 * 2, "master": 8 * 12_704 / 4 * 4, "bf16_only": 8 * 12_704 / 4 * 2}
    ### END SOLUTION


class LossScaler:
    def __init__(self, dp, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        ### BEGIN SOLUTION
        self.dp = dp
        self.current = float(init_scale)
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self.clean = 0               # clean steps in a row
        self.found_inf = False
        ### END SOLUTION

    def scale(self, loss):
        ### BEGIN SOLUTION
        return loss * self.current
        ### END SOLUTION

    def step(self, optimizer):
        ### BEGIN SOLUTION
        found = torch.zeros(1)
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.current)
                    if not torch.isfinite(p.grad).all():
                        found.fill_(1.0)
        self.dp.all_reduce(found)       # one rank's inf makes every rank skip
        self.found_inf = bool(found.item() > 0)
        if not self.found_inf:
            optimizer.step()
        ### END SOLUTION

    def update(self):
        ### BEGIN SOLUTION
        if self.found_inf:
            self.current *= self.backoff_factor
            self.clean = 0
        else:
            self.clean += 1
            if self.clean == self.growth_interval:
                self.current *= self.growth_factor
                self.clean = 0
        ### END SOLUTION

    def get_scale(self):
        ### BEGIN SOLUTION
        return self.current
        ### END SOLUTION


### BEGIN SOLUTION
class _CastGathered(torch.autograd.Function):
    """The block in the compute dtype on gathered casts of the shard; the backward reduces in float32."""

    @staticmethod
    def forward(ctx, x, shard, module):
        ctx.module = module
        ctx.save_for_backward(x)
        full = module.dp.all_gather(shard.detach().to(module.dtype))       # half the bytes of float32
        y = functional_call(module.block, module.weights(full), (x.to(module.dtype),))
        return y.float()

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        module = ctx.module
        full = module.dp.all_gather(module.shard.detach().to(module.dtype)).requires_grad_()
        with torch.enable_grad():
            x_in = x.detach().to(module.dtype).requires_grad_(x.requires_grad)
            y = functional_call(module.block, module.weights(full), (x_in,))
            inputs = (x_in, full) if x.requires_grad else (full,)
            grads = torch.autograd.grad(y, inputs, grad_y.to(y.dtype))
        grad_x = grads[0].float() if x.requires_grad else None
        grad_shard = module.dp.reduce_scatter(grads[-1].float()) / module.dp.size     # summed in float32
        return grad_x, grad_shard, None
### END SOLUTION


def mixed_precision_layer(layer, dp, compute_dtype):
    ### BEGIN SOLUTION
    return CastShardedLayer(layer, dp, compute_dtype)
    ### END SOLUTION


### BEGIN SOLUTION
class CastShardedLayer(nn.Module):
    def __init__(self, layer, dp, compute_dtype):
        super().__init__()
        self.dp, self.dtype = dp, compute_dtype
        self.shapes = [(name, p.shape, p.numel()) for name, p in layer.named_parameters()]
        flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()]).float()
        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[dp.rank].clone())   # the float32 master
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        self._block = [layer]

    @property
    def block(self):
        return self._block[0]

    def weights(self, full):
        out, offset = {}, 0
        for name, shape, count in self.shapes:
            out[name] = full[offset:offset + count].view(shape)
            offset += count
        return out

    def forward(self, x):
        return _CastGathered.apply(x, self.shard, self)
### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs two cases on 2 ranks, four steps each, with 2 blocks of hidden size 16. One computes in
# bfloat16. The other computes in float16 with your LossScaler (growth every 2 clean steps), and the lab puts
# an inf into rank 1's shard gradient at step 2. Per case it prints the bytes per element of each gather and
# reduce-scatter, as your ring carried them, and the dtypes of the shard and its gradient. It also prints the
# largest difference from one process computing the same casts, and, in fp16, the scale after each step
# beside GradScaler's. Then it prints your prediction, each number right or wrong.

# %%
report = check("q26")

# %% [markdown]
# ## What your code did
#
# The run's fp16 case, its four steps on each rank: a forward and a backward box per step. The thin row under
# each rank holds the gathers and reduce-scatters your module asked for, inside those boxes: two gathers per
# block and step (one for the forward, one for the backward) and one reduce-scatter. The ring's messages run
# in that row too, and so does your scaler's one all-reduce per step, after the backward. The step with the
# lab's inf looks like any other here: what it changed (no update, the scale halved) is in the check's
# printout above.
#
# The memory lane stacks what each rank holds when each of its operations ends. Grey is the float32 master:
# each rank's halves of the two blocks, 13,120 B. Teal is a gathered float16 copy while its block runs: one
# whole block at 2 bytes a parameter, 6,560 B, half the grey band. Orange is the float32 gradients of the
# shards, which grow during the backward.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q26_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q26 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q26")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q26")
### END HIDDEN TESTS
