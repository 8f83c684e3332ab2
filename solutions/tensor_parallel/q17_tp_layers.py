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
# # Q17 · Tensor parallel: column and row parallel layers, the MLP with one all-reduce
#
# *Exercise q17 of the pipeline-parallelism lab · 20 points*
#
# A pipeline gives each rank whole layers. **Tensor parallelism** cuts *inside* a layer: each of t ranks
# holds 1/t of every weight matrix and does 1/t of every matrix product, on the same input. It needs no
# micro-batches and has no bubble, but the ranks must talk inside every layer, in the forward and in the
# backward: which is why it lives on the fastest links (the GPUs of one node), and pipelines go between
# nodes.
#
# A linear layer `y = x Wᵀ + b` (PyTorch's `nn.Linear`: `weight` is out_features × in_features) can be cut
# two ways:
#
# - **column parallel**: rank r holds a slice of the *output* features (rows of `weight`, and of `bias`).
#   Every rank needs the whole input and computes its slice of the output. Nothing to add up.
# - **row parallel**: rank r holds a slice of the *input* features (columns of `weight`). Each rank needs
#   only its slice of the input and computes a *partial sum* of the whole output: the t partial sums
#   must be added (an all-reduce), and the bias added once.
#
# Put a column-parallel layer first and a row-parallel one second, and the slice the first produces on a
# rank is exactly the slice the second needs: the elementwise activation in between needs nothing from
# the other ranks. The block's MLP, `down(gelu(up(x)))` (`up`: 32 → 128, `down`: 128 → 32), then needs
# one all-reduce in the forward, after `down`, and, because every rank used the whole input x, one in the
# backward, to add up the input's gradient. Megatron-LM names the two conjugate operations *f* and *g*:
#
# | | forward | backward |
# |---|---|---|
# | f: copy into the tensor-parallel region (before `up`) | identity | all-reduce |
# | g: reduce from the region (after `down`) | all-reduce | identity |
#
# The figure is the lab's model on 2 ranks: which rows and columns each rank holds, and the two rounds.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.tensor_parallel.figure import tp_figure

tp_figure(t=2)

# %% [markdown]
# ## Predict first
#
# The check runs your MLP on t = 2 and t = 4 ranks, in float64, on an input of shape (2, 16, 32), and
# records every collective your code makes. Before you write any code: **how many bytes does rank 0 hand
# to all-reduce in one forward and one backward of the MLP, for t = 2 and for t = 4?** And would the
# answer change if the column-parallel layer gathered its whole output (an all-gather) and the
# row-parallel layer took the whole activation? Write your numbers and one sentence of why in the cell
# below; the check prints what it measured, and your numbers are graded by hand.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q17_prediction", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# Rank 0 hands 2 · 16 · 32 · 8 = 8,192 bytes to one all-reduce in the forward (the partial sums, g) and
# 8,192 in the backward (the input's gradient, f), for t = 2 and for t = 4 alike: what travels is the
# activation (batch × sequence × hidden), never the weights, and it does not shrink with t. With an
# all-gather between the layers, each rank would also gather the whole 4h-wide activation, t × its
# 2 · 16 · 128/t · 8 bytes, in every forward, for nothing: its own slice is what the row layer needs.

# %% [markdown]
# ## Your task
#
# Write, in one answer cell, with `torch.distributed` (`dist.all_reduce(tensor, group=tp.group)` sums a
# tensor in place over the group), the pieces of the contract below: the two communication functions as
# `torch.autograd.Function`s, the two layers, and `tp_layers`, which puts them together. `tp` is what the
# lab hands each rank: `tp.rank`, `tp.size` (t), `tp.group`, `tp.device`.
#
# ```
# CopyToTensorParallel.apply(x, tp)       f: x forward; the backward sums the gradient over the group
# ReduceFromTensorParallel.apply(x, tp)   g: the sum of every rank's x forward; the gradient as it is backward
# ColumnParallelLinear(linear, tp)        parameters weight, bias: rank r's slice of the output features
# RowParallelLinear(linear, tp)           parameter weight: rank r's slice of the input features; bias: whole
# tp_layers(up, down, tp)                 an nn.Module with .up (column) and .down (row): x -> down(gelu(up(x)))
# ```
#
# Rank r's slice is the r-th of t equal contiguous slices (`tensor.chunk(t, dim)[r]`). A column-parallel
# layer takes the whole input and returns its slice of the output; a row-parallel layer takes its slice of
# the input and returns the whole output on every rank, its bias added once. Each rank keeps only its
# shards as parameters (new tensors, not the unsharded layers): 1/t of the MLP's weights. The whole
# contract: `help(lab_src.exercises.tp_layers)`.
#
# What the grader compares, on 2 and 4 ranks: the outputs, the input's gradient and every shard's weight
# and bias gradients against the unsharded layers (to 1e-10 in float64), and the collectives each forward
# and backward made (kind, bytes, group): one all-reduce of the activation each way, no more.
#
# <details><summary><b>Hint</b>: the autograd functions (open it if you are stuck)</summary>
#
# A `torch.autograd.Function` has two static methods, `forward(ctx, x, tp)` and `backward(ctx, grad)`;
# `backward` returns one gradient per input of `forward` (None for `tp`). Keep `tp` on `ctx` for the
# backward. `dist.all_reduce` works in place: reduce a copy (`grad.clone()`), not a tensor autograd still
# needs. In `forward`, returning `x` itself is allowed; `x.view_as(x)` makes the output a new tensor.
# </details>
#
# <details><summary><b>Hint</b>: the layers (open it if you are stuck)</summary>
#
# Each layer keeps only its shard, as a parameter of its own: a detached copy of one t-th of the whole
# weight, not a view of it. Which t-th: the column-parallel layer splits its output features (the weight's
# rows) and its bias with them; the row-parallel layer splits its input features (the weight's columns) and
# keeps its bias whole. In the forward, the column-parallel layer's input passes through your copy function
# before its matmul; the row-parallel layer's partial output passes through your reduce function, and its
# bias comes after the reduction (added before it, the sum would count it t times).
# </details>

# %% nbgrader={"grade": false, "grade_id": "q17_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q17
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; the backward sums the gradients over the tensor-parallel group."""

    @staticmethod
    def forward(ctx, x, tp):
        ### BEGIN SOLUTION
        ctx.tp = tp
        return x.view_as(x)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None
        ### END SOLUTION


class ReduceFromTensorParallel(torch.autograd.Function):
    """Sum over the tensor-parallel group forward; identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ### BEGIN SOLUTION
        x = x.contiguous().clone()
        dist.all_reduce(x, group=tp.group)
        return x
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        return grad, None
        ### END SOLUTION


class ColumnParallelLinear(nn.Module):
    """Rank r's slice of the output features of `linear`."""

    def __init__(self, linear, tp):
        super().__init__()
        ### BEGIN SOLUTION
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=0)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(tp.size, dim=0)[tp.rank].clone())
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)
        ### END SOLUTION


class RowParallelLinear(nn.Module):
    """Rank r's slice of the input features of `linear`; the whole bias, added once."""

    def __init__(self, linear, tp):
        super().__init__()
        ### BEGIN SOLUTION
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.tp) + self.bias
        ### END SOLUTION


def tp_layers(up, down, tp):
    """This rank's part of down(gelu(up(x))): an nn.Module with .up (column) and .down (row)."""
    ### BEGIN SOLUTION
    return TensorParallelMLP(up, down, tp)


class TensorParallelMLP(nn.Module):
    def __init__(self, up, down, tp):
        super().__init__()
        self.up = ColumnParallelLinear(up, tp)
        self.down = RowParallelLinear(down, tp)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs each piece on t = 2 and t = 4 ranks (real processes, gloo on the CPU): the copy and the
# reduction on tensors that differ per rank, each layer alone, then the MLP, each against the unsharded
# layer. It prints, per piece, the collectives rank 0's forward and backward made, and what each rank of
# the MLP holds. Compare them with your prediction.

# %%
report = check("q17")

# %% [markdown]
# ## What your code did
#
# The run on 4 ranks (or, if a case failed, the first that failed: the title says how many ranks) on a
# measured time axis (press play, or move the slider, to step through it one call at a time): each bar is
# one collective your code made, in every rank's lane, labelled with the part and the direction that made
# it. Between two bars a rank computes; the wait of the first call for the last rank to start, and long
# set-up between parts, are cut off (the figure says how long they were). Where would the bars of an
# all-gather between the layers go, and how wide would they be?

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q17_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q17 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q17")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q17")
### END HIDDEN TESTS
