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
# # Q18 · Tensor parallel: the whole block, dropout seeds, training to one process's curve
#
# *Exercise q18 of the pipeline-parallelism lab · 20 points*
#
# TODO: what this step of pipeline parallelism is, and why.

# %%
# %load_ext lab_src
from lab_src.checks import check


# %% [markdown]
# ## Your task
#
# TODO: the contract of `tp_block` (see lab_src/exercises.py).

# %% nbgrader={"grade": false, "grade_id": "q18_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q18
import copy

import torch
from torch import nn

from lab_src.pipeline import dropout


def tp_block(block, tp, q17):
    """This rank's part of the block: attention split by heads, the MLP of q17, LayerNorms replicated."""
    ### BEGIN SOLUTION
    return TensorParallelBlock(block, tp, q17)


def grouped_by_heads(qkv, t):
    """qkv (3h -> h rows: q, k, v) with its rows reordered so that the r-th of t contiguous chunks holds
    shard r's q rows, then its k rows, then its v rows: the layout a column-parallel layer cuts."""
    h = qkv.in_features
    w, b = (p.detach().split(h, dim=0) for p in (qkv.weight, qkv.bias))
    out = nn.Linear(h, 3 * h, dtype=qkv.weight.dtype, device=qkv.weight.device)
    with torch.no_grad():
        out.weight.copy_(torch.cat([torch.cat([part.chunk(t, 0)[r] for part in w]) for r in range(t)]))
        out.bias.copy_(torch.cat([torch.cat([part.chunk(t, 0)[r] for part in b]) for r in range(t)]))
    return out


class TensorParallelBlock(nn.Module):
    def __init__(self, block, tp, q17):
        super().__init__()
        self.tp, self.heads, self.p = tp, block.num_heads // tp.size, block.dropout
        self.attn_norm = copy.deepcopy(block.attn_norm)
        self.mlp_norm = copy.deepcopy(block.mlp_norm)
        self.qkv = q17.ColumnParallelLinear(grouped_by_heads(block.qkv, tp.size), tp)
        self.proj = q17.RowParallelLinear(block.proj, tp)
        self.mlp = q17.tp_layers(block.up, block.down, tp)
        self.shared = dropout.stream(block.seed, block.name)                 # the same on every rank
        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only

    def forward(self, x):
        b, s, h = x.shape
        drop = self.p > 0 and self.training
        q, k, v = self.qkv(self.attn_norm(x)).split(h // self.tp.size, dim=-1)
        q, k, v = (z.view(b, s, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        mask = dropout.keep(self.own, (b, self.heads, s, s), self.p, x) if drop else None
        attn = dropout.attention(q, k, v, mask)
        a = self.proj(attn.transpose(1, 2).reshape(b, s, h // self.tp.size))
        if drop:
            a = a * dropout.keep(self.shared, a.shape, self.p, a)
        x = x + a
        m = self.mlp(self.mlp_norm(x))
        if drop:
            m = m * dropout.keep(self.shared, m.shape, self.p, m)
        return x + m
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# TODO: what the check runs and what it shows.

# %%
report = check("q18")

# %% nbgrader={"grade": true, "grade_id": "q18_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q18 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q18")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q18")
### END HIDDEN TESTS
