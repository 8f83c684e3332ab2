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
# TODO: what this step of pipeline parallelism is, and why.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# ## Your task
#
# TODO: the contract of `tp_layers` (see lab_src/exercises.py).

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


class TensorParallelMLP(nn.Module):
    def __init__(self, up, down, tp):
        super().__init__()
        ### BEGIN SOLUTION
        self.up = ColumnParallelLinear(up, tp)
        self.down = RowParallelLinear(down, tp)
        ### END SOLUTION

    def forward(self, x):
        ### BEGIN SOLUTION
        return self.down(F.gelu(self.up(x)))
        ### END SOLUTION


def tp_layers(up, down, tp):
    return TensorParallelMLP(up, down, tp)


# %% [markdown]
# ## Check
#
# TODO: what the check runs and what it shows.

# %%
report = check("q17")

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
