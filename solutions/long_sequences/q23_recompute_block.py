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
# # Q23 · Long sequences: what a block keeps for its backward, and what recomputing it costs
#
# *Exercise q23 of the pipeline-parallelism lab · 10 points*
#
# A forward pass leaves tensors behind: autograd keeps, for every operation, what its backward will need (a
# matmul's inputs, a softmax's output, a dropout's mask). For one transformer block that memory grows with the
# batch b, the sequence s and the hidden size h, and the attention's part grows with s²: at long sequences it is
# the activations, not the weights, that fill a device. Korthikanti et al. (2022, "Reducing Activation
# Recomputation in Large Transformer Models") count it per layer as **34 sbh + 5 a s² b** bytes (16-bit
# activations, 1-byte dropout masks, a heads), and cut it two ways:
#
# - **Full recomputation** keeps only the block's input (2 sbh) and runs the whole forward again in the backward:
#   a third more matmul work, since a backward costs about two forwards.
# - **Selective recomputation** keeps everything but the attention core (QKᵀ, softmax, dropout, PV), whose
#   s²-sized tensors are most of the memory and little of the work: it recomputes those alone, for a few per cent.
#
# Here you measure both on the lab's own block (pipeline/model.py's `Block`, dropout on), predict its figures from
# a closed form of your own, then write both recomputations so that their gradients are exactly the plain block's.
#
# The figure is the paper's count for one layer of a 7B-sized model (h = 4096, 32 heads, one sequence), computed
# from its formula, not measured: past a few thousand tokens the plain layer keeps more than its weights many
# times over, and the s² term is most of it.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.checks.q23_recompute_block import kept_figure, sp_figure
from lab_src.topics.long_sequences.figure import paper_curves

paper_curves(h=4096, a=32, b=1)

# %% [markdown]
# ## Predict first
#
# Read the block's forward with dropout on (`Block._forward_dropping` in pipeline/model.py, and
# `pipeline/dropout.py`'s `attention` and `keep`) and list what each operation saves. Two facts of this lab
# differ from the paper: its dropout masks are tensors of the activations' dtype (2 bytes each in bfloat16, where
# the paper counts 1), and the attention's causal mask is a bool tensor of s² bytes. A LayerNorm also keeps a mean
# and a 1/std per token. Write your closed form for each mode, check it against the cell above on a few shapes, and
# **predict the bytes the block keeps for b = 4, s = 256, h = 64, a = 8 heads, in bfloat16**, dropout on:
#
#     return {"none": ..., "selective": ..., "full": ...}
#
# in `predicted_saved_bytes()`, as numbers or arithmetic on numbers. "selective" keeps the attention core's inputs
# (q, k, v) and its output but nothing inside it; "full" keeps the block's input alone. They are graded: right
# within half a percent. Write them in the answer cell below now, before you count anything: the next cell measures
# a small float32 block to test your form, the check prints each number beside what your run measured, and the
# figure after it draws them.
#
# <details><summary><b>Hint</b>: the terms (open it if you are stuck)</summary>
#
# Count in elements, then multiply by 2 bytes. The sbh terms: the input, the first LayerNorm's output, the qkv
# projection's output (3 sbh, one storage), the attention's output (proj's input), two residual dropout masks, the
# second LayerNorm's input and output, GELU's input and output (4 sbh each). The a s² b terms: the softmax's output,
# the dropout mask and the dropped probabilities. Then the small ones: 2 LayerNorms × (mean, 1/std) × sb, and s².
# </details>

# %% [markdown]
# ## Then count
#
# Once your prediction is written, test your closed form (not the graded shape: a small float32 one).
# `torch.autograd.graph.saved_tensors_hooks(pack, unpack)` calls `pack(t)` on every tensor an operation saves for
# its backward while the `with` block runs. Count each storage once (q, k and v are views of one tensor), and leave
# the parameters out: they are the model's memory, not the micro-batch's. Run the cell: it counts what one block
# keeps, in float32 (4 bytes an element: every term of your form doubles, but s², the bool mask's). Change b, s, h
# and the heads, and watch which terms grow how.

# %%
import torch

from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import build_piece


def saved_bytes(module, x):
    """Bytes of the tensors autograd saves in module(x)'s forward: each storage once, the parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


b, s, h, a = 2, 32, 32, 4
block = build_piece(LabConfig(hidden_size=h, num_heads=a, seq_len=s, dropout=0.1), "blocks.0").train()
x = torch.randn(b, s, h, requires_grad=True)
print(f"b={b} s={s} h={h} a={a}, float32: the block keeps {saved_bytes(block, x):,} B for its backward")

# %% [markdown]
# ## Your task
#
# Write `recompute_block(block, mode)`: it returns an `nn.Module` whose forward(x) is `block(x)` and whose backward
# gives exactly the plain block's gradients, of x and of the block's own parameters, while it keeps for the backward
#
# - `"none"`: what the block keeps (returning a module that calls the block is enough);
# - `"selective"`: everything but the attention core's inside; the core (QKᵀ, scaling, causal mask, softmax,
#   dropout, PV) keeps only q, k, v and its output, and is recomputed in the backward;
# - `"full"`: the block's input alone; the whole forward is recomputed in the backward.
#
# **The catch: dropout.** The block draws its masks from generators it holds, `block.streams`, never from torch's
# global RNG. A recomputation must draw the same masks as the forward it repeats (else its gradients are those of
# another network) and must leave the generators as it found them: in a pipeline, other micro-batches' forwards
# draw from them between this one's forward and its backward. `torch.utils.checkpoint` is allowed (reentrant or
# not, and its selective policy too), but its `preserve_rng_state` restores torch's own RNG only: save and restore
# the block's generators' states yourself (`g.get_state()`, `g.set_state(...)`).
#
# The lab measures around your module, never from what it reports: the bytes its forward leaves alive (every
# storage, wherever it is kept), the matmul FLOPs of its forward and backward (`torch.utils.flop_counter`), and its
# outputs and gradients over micro-batches in flight (forward A, forward B, backward B, backward A, forward C). A
# mode may keep at most its figure (a recomputation's generator states aside) and may add at most its matmul work:
# none, the core's two products, one forward. The grader runs four shapes in float32 and bfloat16, dropout 0.1 and
# 0.25. The whole contract: `help(lab_src.exercises.recompute_block)`.
#
# <details><summary><b>Hint</b>: one recomputation, two uses (open it if you are stuck)</summary>
#
# Wrap the function you recompute so that its first call runs as it is, and any later call (the recomputation in
# the backward) first notes the generators' states, sets them to those before the first call, runs, and sets them
# back. Full recomputation is `checkpoint(wrapped(block), x, use_reentrant=False)`. For selective, write the
# block's forward yourself (the same operations, in the same order) and checkpoint only the core, drawing its
# attention mask inside it.
# </details>

# %% [markdown]
# ## Your task, part 2: sequence parallelism on the tensor-parallel block
#
# Recomputation trades memory for work. Korthikanti et al. (2022) found a second trade that costs no work at all. In
# q18's tensor-parallel block the attention and the MLP are split across t ranks, but the LayerNorms and the residual
# dropouts are not: every rank computes them on the whole sequence, and keeps their inputs, outputs and masks whole.
# That is 6 sbh of the 18 sbh above on every rank (`records.py` of the topic has the lab's figure: e (6 sbh +
# 12 sbh/t + 3 a s² b/t + 4 sb) + s² per rank). **Sequence parallelism** splits those along the sequence: rank r
# holds the positions [r s/t, (r + 1) s/t) of every sequence there. Before each column-parallel layer (qkv, up) the
# ranks **all-gather** their positions (the layer needs the whole sequence); after each row-parallel layer (proj,
# down) they **reduce-scatter** the partial sums, each keeping the sum on its own positions. An all-reduce is a
# reduce-scatter followed by an all-gather, so the traffic is what tensor parallelism moves, with every activation
# outside the split region at 1/t.
#
# Write `sp_block(block, tp)` in the same answer cell: an `nn.Module` whose forward takes this rank's shard
# x (b, s/t, h), the rank's positions of every sequence, and returns its positions of the block's output, with
# these parts (the lab reads them by name): `attn_norm`, `mlp_norm` (whole, on every rank), `qkv` (column parallel
# by heads, as q18's: weight (3h/t, h)), `proj` (row parallel, weight (h, h/t), bias whole), `up` (column parallel,
# weight (4h/t, h)), `down` (row parallel, weight (h, 4h/t), bias whole). `tp` is q17's (`tp.rank`, `tp.size`,
# `tp.group`); use `dist.all_gather_single` and `dist.reduce_scatter_single` over `tp.group` (both work on the
# first dimension: put the sequence first). Three catches:
#
# - **Memory.** A column-parallel layer must keep its *shard* for the backward and gather it again there. Autograd's
#   `F.linear` on the all-gather's output would keep the whole gathered input. Write the layer as an autograd
#   Function that saves its shard. In the backward, the all-gather becomes a reduce-scatter of the input's gradient,
#   and the reduce-scatter becomes an all-gather.
# - **Replicated parameters on a shard.** The LayerNorms and the row-parallel layers' biases are whole on every rank
#   but see only its s/t positions. Their gradients must be summed over `tp.group` in the backward, or the replicas
#   drift apart.
# - **Dropout.** The masks must be one process's. Each rank draws its heads' attention mask over the whole sequence
#   from its own stream (as in q18). On a residual, each rank draws the whole (b, s, h) mask from the shared stream
#   and keeps its positions (a copy of the slice: a slice is a view, and a view keeps the whole mask alive).
#
# And `predicted_sp_saved_bytes()`: **the bytes one rank keeps at the prediction's shape (b = 4, s = 256, h = 64,
# 8 heads, bfloat16, dropout on) on t = 4 ranks, with tensor parallelism alone and with sequence parallelism.** It is
# graded like the first prediction. The paper's forms are sbh (10 + 24/t + 5 as/(ht)) and sbh/t (34 + 5 as/h), with
# 1-byte masks. Count as you did for the plain block.
#
# What the grader runs, on t = 2 and t = 4 ranks in float64, dropout off and on: each rank's output and gradients
# against one process's block (1e-10); the replicated gradients equal one process's on every rank; the bytes each
# rank kept for the backward against the closed form (what autograd saved, or everything the forward left alive,
# on `ctx` or in a closure too, where that is more); the all-gathers and reduce-scatters, each one's bytes. It also
# trains the digits model (q13's) with your blocks on t = 2 ranks, dropout 0.1, against one process's curve (1e-5
# relative, as in q18).
# The whole contract: `help(lab_src.exercises.recompute_block)`.
#

# %% nbgrader={"grade": false, "grade_id": "q23_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q23
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lab_src.pipeline import dropout


def predicted_saved_bytes():
    """b = 4, s = 256, h = 64, a = 8 heads, bfloat16, dropout on: bytes the block keeps for its backward, per mode."""
    # return {"none": ..., "selective": ..., "full": ...} with a number for each
    ### BEGIN SOLUTION
    # 2 (18 sbh + 3 a s^2 b + 4 sb) + s^2; 2 (18 sbh + 4 sb); 2 sbh
    return {"none": 2 * (18 * 256 * 4 * 64 + 3 * 8 * 256 * 256 * 4 + 4 * 256 * 4) + 256 * 256,
            "selective": 2 * (18 * 256 * 4 * 64 + 4 * 256 * 4),
            "full": 2 * 256 * 4 * 64}
    ### END SOLUTION


def recompute_block(block, mode):
    ### BEGIN SOLUTION
    return Recomputed(block, mode)


def _generators(block):
    """The generators the block's dropout draws from (made as the block makes them, on first use)."""
    if not (block.dropout > 0 and block.training):
        return []
    if block.streams is None:
        block.streams = dropout.Streams(block.seed, block.name, block.dropout_shards)
    return [block.streams.shared, *block.streams.shards]


def _replayed(fn, gens):
    """fn, run once as it is; run again (the recomputation in the backward), from the generators' states of the
    first run, leaving them where they were before it."""
    states = [g.get_state() for g in gens]
    runs = []

    def run(*args):
        if not runs:
            runs.append(1)
            return fn(*args)
        now = [g.get_state() for g in gens]
        for g, state in zip(gens, states):
            g.set_state(state)
        try:
            return fn(*args)
        finally:
            for g, state in zip(gens, now):
                g.set_state(state)
    return run


class Recomputed(nn.Module):
    def __init__(self, block, mode):
        super().__init__()
        if mode not in ("none", "selective", "full"):
            raise ValueError(f"mode must be 'none', 'selective' or 'full', not {mode!r}")
        self.block, self.mode = block, mode

    def forward(self, x):
        if self.mode == "none":
            return self.block(x)
        gens = _generators(self.block)
        if self.mode == "full":
            return checkpoint(_replayed(self.block, gens), x, use_reentrant=False)
        return self._selective(x, gens)

    def _selective(self, x, gens):
        blk = self.block
        b, s, h = x.shape
        heads, p = blk.num_heads, blk.dropout
        q, k, v = blk.qkv(blk.attn_norm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in (q, k, v))
        if gens:
            def core(q, k, v):
                return dropout.attention(q, k, v, blk.streams.attention_mask((b, heads, s, s), p, x))
        else:
            def core(q, k, v):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        attn = checkpoint(_replayed(core, gens), q, k, v, use_reentrant=False)
        a = blk.proj(attn.transpose(1, 2).reshape(b, s, h))
        if gens:
            a = a * dropout.keep(blk.streams.shared, a.shape, p, a)
        x = x + a
        m = blk.down(F.gelu(blk.up(blk.mlp_norm(x))))
        if gens:
            m = m * dropout.keep(blk.streams.shared, m.shape, p, m)
        return x + m
    ### END SOLUTION



def sp_block(block, tp):
    """This rank's part of the block on its sequence shard x (b, s/t, h): sequence parallel around q18's split."""
    ### BEGIN SOLUTION
    return SequenceParallelBlock(block, tp)


def _all_gather(x, tp):
    """(b, s/t, h) on each rank -> (b, s, h): the shards put together along the sequence, in rank order."""
    piece = x.transpose(0, 1).contiguous()
    out = piece.new_empty((tp.size * piece.shape[0],) + tuple(piece.shape[1:]))
    dist.all_gather_single(out, piece, group=tp.group)
    return out.transpose(0, 1)


def _reduce_scatter(x, tp):
    """(b, s, h) partial sums on each rank -> (b, s/t, h): this rank's shard of their sum."""
    whole = x.transpose(0, 1).contiguous()
    out = whole.new_empty((whole.shape[0] // tp.size,) + tuple(whole.shape[1:]))
    dist.reduce_scatter_single(out, whole, group=tp.group)
    return out.transpose(0, 1)


class GatherLinear(torch.autograd.Function):
    """Column parallel on a sequence shard: all-gather x, then x W^T + b. Keeps only the shard for the
    backward and gathers it again there; the input's gradient is reduce-scattered back to the shards."""

    @staticmethod
    def forward(ctx, x, weight, bias, tp):
        ctx.tp = tp
        ctx.save_for_backward(x, weight)
        return F.linear(_all_gather(x, tp), weight, bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        whole = _all_gather(x, ctx.tp)                       # gathered again, not kept
        grad_x = _reduce_scatter(grad @ weight, ctx.tp)
        g, w = grad.reshape(-1, grad.shape[-1]), whole.reshape(-1, whole.shape[-1])
        return grad_x, g.t() @ w, g.sum(0), None


class ScatterToSequence(torch.autograd.Function):
    """Forward: the partial sums reduce-scattered to this rank's sequence shard; backward: all-gathered."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return _reduce_scatter(x, tp)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad.contiguous(), ctx.tp), None


class SummedGrad(torch.autograd.Function):
    """A replicated parameter used on a sequence shard: itself forward; its gradient summed over the group."""

    @staticmethod
    def forward(ctx, p, tp):
        ctx.tp = tp
        return p.view_as(p)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class ColumnSequenceParallel(nn.Module):
    def __init__(self, linear, tp):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, 0)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(tp.size, 0)[tp.rank].clone())

    def forward(self, x):
        return GatherLinear.apply(x, self.weight, self.bias, self.tp)


class RowSequenceParallel(nn.Module):
    def __init__(self, linear, tp):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, 1)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return ScatterToSequence.apply(F.linear(x, self.weight), self.tp) + SummedGrad.apply(self.bias, self.tp)


def _by_heads(qkv, t):
    """qkv with its rows reordered so that the r-th of t chunks holds shard r's q, k and v rows."""
    h = qkv.in_features
    out = nn.Linear(h, 3 * h, dtype=qkv.weight.dtype, device=qkv.weight.device)
    with torch.no_grad():
        for mine, theirs in ((out.weight, qkv.weight), (out.bias, qkv.bias)):
            parts = theirs.detach().split(h, 0)
            mine.copy_(torch.cat([torch.cat([p.chunk(t, 0)[r] for p in parts]) for r in range(t)]))
    return out


class SequenceParallelBlock(nn.Module):
    def __init__(self, block, tp):
        super().__init__()
        self.tp, self.heads, self.p = tp, block.num_heads // tp.size, block.dropout
        self.attn_norm = copy.deepcopy(block.attn_norm)
        self.mlp_norm = copy.deepcopy(block.mlp_norm)
        self.qkv = ColumnSequenceParallel(_by_heads(block.qkv, tp.size), tp)
        self.proj = RowSequenceParallel(block.proj, tp)
        self.up = ColumnSequenceParallel(block.up, tp)
        self.down = RowSequenceParallel(block.down, tp)
        self.shared = dropout.stream(block.seed, block.name)                 # the same on every rank
        self.own = dropout.stream(block.seed, block.name, shard=tp.rank)     # this rank's heads only

    def _norm(self, norm, x):
        return F.layer_norm(x, norm.normalized_shape, SummedGrad.apply(norm.weight, self.tp),
                            SummedGrad.apply(norm.bias, self.tp), norm.eps)

    def _dropped(self, y, drop):
        """y (this rank's shard) times its slice of the (b, s, h) mask one process draws."""
        if not drop:
            return y
        b, n, h = y.shape
        mask = dropout.keep(self.shared, (b, n * self.tp.size, h), self.p, y)
        return y * mask[:, self.tp.rank * n:(self.tp.rank + 1) * n].clone()     # a copy: a view keeps it all

    def forward(self, x):
        b, n, h = x.shape                      # n = s / t positions of this rank
        s, t = n * self.tp.size, self.tp.size
        drop = self.p > 0 and self.training
        q, k, v = self.qkv(self._norm(self.attn_norm, x)).split(h // t, dim=-1)
        q, k, v = (z.view(b, s, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        mask = dropout.keep(self.own, (b, self.heads, s, s), self.p, x) if drop else None
        attn = dropout.attention(q, k, v, mask)
        x = x + self._dropped(self.proj(attn.transpose(1, 2).reshape(b, s, h // t)), drop)
        m = self.down(F.gelu(self.up(self._norm(self.mlp_norm, x))))
        return x + self._dropped(m, drop)
    ### END SOLUTION


def predicted_sp_saved_bytes():
    """Bytes ONE of t = 4 ranks keeps for its backward, q18's block and sp_block: b, s, h, a as above, bfloat16."""
    # return {"tensor_parallel": ..., "sequence_parallel": ...} with a number for each
    ### BEGIN SOLUTION
    # TP: 2 (6 sbh + 12 sbh/t + 3 a s^2 b/t + 4 sb) + s^2; SP: 2 (18 sbh + 3 a s^2 b + 4 sb)/t + s^2
    return {"tensor_parallel": 2 * (6 * 256 * 4 * 64 + 12 * 256 * 4 * 64 / 4 + 3 * 8 * 256 * 256 * 4 / 4
                                    + 4 * 256 * 4) + 256 * 256,
            "sequence_parallel": 2 * (18 * 256 * 4 * 64 + 3 * 8 * 256 * 256 * 4 + 4 * 256 * 4) / 4 + 256 * 256}
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check builds the lab's block at the prediction's shape in bfloat16 (dropout 0.1), then a float32 one of
# b = 2, s = 128, h = 64, 4 heads, and runs your three modes on each. Per mode it prints the bytes your forward
# left alive (the lab's count: autograd's saved tensors and any other tensor kept), beside the mode's closed form
# and the paper's; the matmul FLOPs of the forward and backward against the plain block's; and whether the
# gradients over micro-batches in flight are the plain block's. Then your prediction, each number right or wrong.

# %%
report = check("q23")

# %% [markdown]
# ## What your run kept
#
# The bytes each mode kept in the bfloat16 run, measured, beside your prediction and the paper's figure. The
# plain block's bar is mostly the attention's three s²-sized tensors: at s = 256 and h = 64 they are 6 as/h = 24
# times the 36 sbh of everything else together (the paper's 5 as/h against 34). Selective recomputation removes
# them for about 6.7 % more matmul work here (s/(36h + 6s): torch's checkpoint stops the recomputation once it has
# remade what the backward needs, so PV is not redone); full recomputation keeps only the input, for a third more.
# The full bar stands a little above 2 sbh: a recomputation keeps the generators' states it replays (5,056 B each).

# %%
kept_figure(report)

# %% [markdown]
# ## Sequence parallelism: what each rank kept
#
# The check also ran your `sp_block` on t = 2 and t = 4 ranks, and trained the digits model with it (its curve's
# distance from one process's is in the check's output). The figure shows its bfloat16 run at the prediction's
# shape on t = 4 ranks: the bytes each rank saved for its backward, beside the lab's closed forms for one process,
# for t-way tensor parallelism and for sequence parallelism, and your prediction. Tensor parallelism keeps 6 sbh
# whole on every rank; sequence parallelism keeps 1/t of everything but the causal mask. The collectives are the
# same bytes in both: two all-gathers and two reduce-scatters each way in place of two all-reduces.
#

# %%
sp_figure(report)

# %% [markdown]
# ## In the pipeline: your 1F1B step with recomputation (not graded)
#
# In q12 each rank r of a p-stage 1F1B pipeline holds up to min(p − r, m) micro-batches awaiting their backward, and
# each of them keeps what every block of its stage saved. The study below runs your q12 step on 4 ranks of the lab's
# model (8 blocks, 2 a stage; micro-batches of b = 2, s = 128, h = 64, 4 heads, float32, dropout 0.1; m = 8) three
# times, every block wrapped by your `recompute_block` in one mode each run. For each rank it prints the micro-batches
# held at the peak, the saved bytes held then (the memory lane's count), and per micro-batch the bytes beside your
# closed form for two blocks.
#
# **Predict first** (not graded; write it down): rank 0 holds 4 micro-batches at its peak. How many times smaller is
# that peak's block memory with `"full"` than with `"none"`? Which rank gains the most bytes, and why that one?

# %%
from lab_src.checks.recompute_study import pipeline_kept_figure, recompute_study

study = recompute_study()

# %% [markdown]
# Per rank and mode: what one micro-batch kept (its peak over the micro-batches it held), the closed form of its two
# blocks marked. The middle ranks keep their blocks' closed form exactly; rank 0 also keeps the embedding's and the last
# rank the head's and the loss's, the same bytes in every mode. Recomputation divides what each micro-batch keeps, and
# 1F1B multiplies it by the micro-batches in flight, so rank 0, which holds the most, gains the most: with the
# reference answers its peak is 22,196,224 B with `"none"`, 9,482,240 B selective and 536,576 B full (bytes, so your
# run's are the same wherever it runs), 41 times less. The count leaves
# out what a recomputing block makes again inside its own backward: one block's activations, alive only there. The
# timeline below is the `"full"` run (`study.timeline(0)` is `"none"`, `1` `"selective"`), its memory lane under the
# ranks.

# %%
pipeline_kept_figure(study)

# %%
study.timeline(2) if study else None

# %% nbgrader={"grade": true, "grade_id": "q23_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q23 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q23")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q23")
### END HIDDEN TESTS
