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
from lab_src.checks.q23_recompute_block import kept_figure
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

# %% nbgrader={"grade": false, "grade_id": "q23_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q23
import torch
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
