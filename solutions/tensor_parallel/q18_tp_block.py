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
# q17 split the block's MLP. Now the whole block: **attention splits by heads**. Each head attends on its
# own, so rank r can hold the q, k and v rows of its t-th of the heads (a column-parallel qkv), compute
# their attention without asking anyone, and hand its heads' output to a row-parallel `proj`, whose partial
# sums one all-reduce adds up: the same column → row pattern as the MLP, one round each way per sub-layer.
# The two LayerNorms are small and not split: every rank holds the whole of each (*replicated*).
#
# Then dropout, and q01's question as code: **should the seeds be the same on the tensor-parallel ranks?**
# The lab defines one process's masks so that a sharded run can reproduce them exactly (pipeline/dropout.py):
# each block has a *shared* stream, `dropout.stream(seed, name)`, and one stream per shard j of t,
# `dropout.stream(seed, name, shard=j)`. Which of them should each of the block's three dropouts draw from
# on a tensor-parallel rank? That is the question this notebook asks you before you write any code.
#
# The figure is the lab's block on 2 ranks: what each rank holds and where the four rounds are.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.tensor_parallel.block_figure import tp_block_figure

tp_block_figure(t=2, streams=False)

# %% [markdown]
# ## Predict first
#
# Before you write any code: the check trains the digits model (q13's data and loop) with dropout 0.1 on
# t = 2 ranks and compares its loss curve with one process's, step by step. **What happens to the curve, and
# to the two ranks' LayerNorm weights, if (a) every rank draws its attention mask from the same stream, (b)
# the residual masks are drawn from a stream seeded with the rank?** Which of the two would the
# tensor-parallel run itself notice, without a single-process run to compare with? Write your answer below
# (graded by hand); the experiment after the check runs both.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q18_prediction", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# (a) Every shard's heads get the same mask: the ranks still agree with each other (the reduced output is
# the same everywhere), the LayerNorms stay identical, but the masks are not one process's, so the curve
# leaves it at the first step, by the size of a different dropout sample (1e-3 or so), and nothing in the
# tensor-parallel run itself notices. (b) The ranks drop different elements of the same replicated
# activation: their residual streams, losses and LayerNorm gradients differ, so after one optimizer step
# the "replicated" LayerNorms differ between the ranks, and the curve leaves one process's too: this one is
# visible without a reference (compare the ranks).

# %% [markdown]
# ## Two streams
#
# Both answers are right, in different places. Outside the sharded region (the residual stream, where the
# replicated LayerNorms live) every rank holds the same activation, so every rank must drop the same
# elements, or the replicas drift apart. Inside it (the attention probabilities of each rank's heads) the
# ranks hold different heads, and each must drop its own, or every shard's heads get the same mask, which
# one process never draws. Megatron-LM keeps two random streams for exactly this (its `tensor_parallel/
# random.py`: the default stream the same on every rank, a second one offset by the tensor-parallel rank).
#
# **How the lab defines the single process's masks** (pipeline/dropout.py), so that a sharded run can
# reproduce them exactly: each block has a *shared* stream, `dropout.stream(seed, name)`, and one stream per
# shard j of t, `dropout.stream(seed, name, shard=j)`. In each training forward the unsharded block draws,
# for j = 0..t-1, the attention mask of the heads of shard j (shape (b, heads/t, s, s)) from shard j's
# stream, then the residual mask after `proj` and the one after the MLP ((b, s, h) each) from the shared
# stream. Undo the sharding of a right tensor-parallel run and its masks are these, element for element.
#
# The block again, with the stream each dropout draws from:

# %%
tp_block_figure(t=2)

# %% [markdown]
# ## Your task
#
# Write `tp_block(block, tp, q17)`: this rank's part of the block, an `nn.Module` whose forward takes the
# whole input x (b, s, h), the same on every rank, and returns the block's whole output on every rank.
# `block` is the unsharded `Block` (pipeline/model.py; `block.num_heads`, `block.dropout`, `block.seed`,
# `block.name`), `tp` as in q17, `q17` your q17 pieces (`q17.ColumnParallelLinear`, `q17.RowParallelLinear`,
# `q17.tp_layers`, the two autograd functions; in grading, the reference's).
#
# ```
# module.attn_norm, module.mlp_norm   the block's LayerNorms, whole, on every rank
# module.qkv      column parallel by heads: weight (3h/t, h), bias (3h/t,): q, then k, then v rows of rank r's heads
# module.proj     row parallel: weight (h, h/t), the columns of rank r's heads; bias whole, added once
# module.mlp      q17's MLP: q17.tp_layers(block.up, block.down, tp)
# ```
#
# One all-reduce after the attention and one after the MLP in the forward, one before each in the backward:
# no more. With `block.dropout` > 0, in training mode, drop the attention probabilities of this rank's heads,
# then `proj`'s output, then the MLP's output (each before its residual add), with masks from
# `dropout.keep(generator, shape, block.dropout, like)` and two streams you make once, with the module, from
# `dropout.stream(block.seed, block.name, shard=...)`, each mask from the stream the section above gives it. Causal
# attention with a dropped probability mask: `dropout.attention(q, k, v, mask)` (without one, torch's). The
# whole contract: `help(lab_src.exercises.tp_block)`.
#
# Also in the answer cell, `predicted_bytes()`: **how many bytes one training step of the digits model
# moves** (4 blocks, hidden 32, 64 pixels, batches of 32; counted as q14 counts: every rank's all-reduce
# buffers and every send, summed over all ranks) with tensor parallelism on t = 2 ranks, and with a 2-stage
# pipeline of 4 micro-batches instead. Numbers only; the check prints what it measured beside them.
#
# What the grader compares, on 2 and 4 ranks: outputs, the input's gradient and every shard's gradients
# against the unsharded block (float64, 1e-10), dropout off and on; the LayerNorms after an AdamW step
# (identical on every rank); the collectives; the digits model trained with t = 2 and with t = 2 × p = 2 on
# 4 ranks against one process's curve (1e-5 relative, float32); your two byte counts.
#
# <details><summary><b>Hint</b>: qkv by heads (open it if you are stuck)</summary>
#
# `block.qkv.weight` is (3h, h): q's h rows, then k's, then v's, each h = heads × head size. A plain
# `chunk(t)` of it would give rank 0 all of q and part of k. Build a new `nn.Linear(h, 3h)` whose rows are
# reordered so that its r-th contiguous chunk is [q rows of shard r; k rows of shard r; v rows of shard r]
# (`w.split(h)` then `part.chunk(t)[r]` for each part, concatenated), and hand that to
# `q17.ColumnParallelLinear`: its output on rank r splits into q, k, v of its heads with `.split(h // t, -1)`.
# </details>
#
# <details><summary><b>Hint</b>: the streams (open it if you are stuck)</summary>
#
# Two generators, made in `__init__`: `shared = dropout.stream(block.seed, block.name)` for the residual
# masks (outside the sharded region: the same on every rank), `own = dropout.stream(block.seed, block.name,
# shard=tp.rank)` for the attention mask of this rank's heads, shape (b, heads/t, s, s). Draw in the
# single process's order: the attention mask, then `proj`'s, then the MLP's.
# </details>
#
# <details><summary><b>Hint</b>: the bytes (open it if you are stuck)</summary>
#
# The activation of a whole batch is 32 × 64 × 32 float32 values. Tensor parallel: 4 all-reduces per block
# (two forward, two backward), 4 blocks, and each of the 2 ranks hands its whole buffer. Pipeline: one
# boundary; each micro-batch (a quarter of the batch) crosses it forward once and its gradient back once.
# </details>

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


def predicted_bytes():
    """Bytes one training step of the digits model moves, summed over all ranks: numbers only."""
    # "tensor_parallel": t = 2, no pipeline; "pipeline": p = 2 stages of 4 micro-batches, no tensor parallelism
    ### BEGIN SOLUTION
    return {"tensor_parallel": 4 * 4 * 2 * (32 * 64 * 32 * 4),    # blocks x all-reduces x ranks x activation
            "pipeline": 2 * 4 * (8 * 64 * 32 * 4)}                 # (forward + back) x micro-batches x activation
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# One launch: the block on t = 2 and t = 4 ranks (dropout off, then on), then the digits model trained for
# 20 steps with t = 2 (dropout 0.1), with t = 2 × p = 2 on 4 ranks (tensor parallel inside each of two
# pipeline stages: each stage's all-reduces go over its own two ranks), and as a plain 2-stage pipeline, for
# the bytes. Compare the curves' distance from one process with q13's, and the bytes with your prediction.

# %%
report = check("q18")

# %% [markdown]
# ## The curves
#
# Each run's loss against one process's, and their relative difference per step: a right run stays at
# float32's rounding, far under the tolerance.

# %%
from lab_src.checks.q18_tp_block import curves

curves(report)

# %% [markdown]
# ## Experiment: a wrong seed policy
#
# The same t = 2 training, three times: with your streams, then with the lab answering your block's
# `dropout.stream` calls by a wrong policy: the attention masks from one stream shared by the ranks, and the
# residual (replicated) region's stream seeded per rank. The table gives each curve's largest distance
# from one process and how far apart the two ranks' LayerNorms ended. Compare with your prediction: which
# mistake could a run without a single-process reference have caught?

# %%
from lab_src.checks.tp_seeds import seed_policies

seed_policies()

# %% [markdown]
# ## What your code did
#
# The block's run on 4 ranks (or the first case that failed: the title says how many ranks) on a measured
# time axis, each call labelled with its part and direction: the all-reduces of each part (two forward, two
# backward; the dropout part also runs its forward once in evaluation mode, "eval"). Per step of the
# digits model that is 16 all-reduces of the whole activation against the pipeline's 8 micro-batch messages
# of a quarter of it each: the check's byte counts. Which link would you give to each, on a cluster of
# nodes with 8 GPUs each?

# %%
report.timeline()

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
