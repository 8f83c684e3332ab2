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
# # Q22 · Sharding the parameters too: FSDP inside a pipeline stage, layer by layer (ZeRO-3)
#
# *Exercise q22 of the pipeline-parallelism lab · 20 points*
#
# After q21 every rank still holds every parameter. **ZeRO-3**, which PyTorch calls FSDP (fully sharded data
# parallel), shards those too. At rest a rank keeps only its 1/n of each layer's weights. Just before a layer
# runs, its replicas **all-gather** the whole layer, run it, and **free** the copy at once. The backward does
# the same again, and then **reduce-scatters** the layer's gradient, so each rank keeps its shard's average.
# At any moment a rank holds its shards plus the one layer it is running. That is how torchtitan trains inside
# each pipeline stage: FSDP over the data-parallel replicas of a stage, 1F1B between the stages.
#
# The figure shows the rhythm on one rank of a stage of 3 layers sharded over 2 ranks, for one micro-batch: the
# layers' bytes it holds over time.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.sharding.figure import fsdp_figure

fsdp_figure(layers=3, n=2)

# %% [markdown]
# ## Predict first
#
# A block of the lab's default model (hidden size 32) has 12,704 float32 parameters. A stage holds 4 blocks,
# sharded over n = 4 data-parallel ranks. **How many bytes of the blocks' parameters does a rank hold at rest
# (`"rest"`), and at the peak of a forward, with one layer gathered (`"peak"`)?** And **in one step of m = 8
# micro-batches, how many times does a rank gather one block (`"gathers"`: one block's count, not the four
# blocks' together)?** Write the three numbers in `predicted_fsdp_bytes()` before you write the layer, as
#
#     return {"rest": ..., "peak": ..., "gathers": ...}
#
# They are graded: right within half a percent. The check prints each number as right or wrong, beside the
# figure it is judged against.

# %% [markdown]
# ## Your task
#
# Write `fsdp_layer(layer, dp)`. It returns an `nn.Module` that stands for `layer`, one transformer block of a
# pipeline stage: its forward takes x and returns the block's output. The module holds only this rank's shard
# of the block's parameters:
#
# - `self.shard`: an `nn.Parameter`, shard `dp.rank` of the block's parameters flattened in
#   `layer.named_parameters()` order, as `torch.tensor_split` cuts them into `dp.size` shards. Free the block's
#   own parameters (`p.data = torch.empty(0)`): nothing else of them may stay allocated.
# - **Forward:** `full = dp.all_gather(self.shard)` gives the whole flat vector, as a new tensor. Run the block
#   with those weights (`torch.func.functional_call(layer, weights, (x,))`, with views of `full` as the
#   weights), then let `full` go: keep no reference to it once the forward returns.
# - **Backward:** gather again and compute the gradients of x and of the flat weights. The simplest way is to
#   recompute the block's forward from the saved x. Then `dp.reduce_scatter(flat_grad)` gives the sum over the
#   group, cut to this rank's shard; divided by `dp.size`, it is the shard's gradient. Free the copy again.
#
# `dp.all_gather` and `dp.reduce_scatter` run on your q19 `ring_all_reduce` over `dp.group` (the reference's
# ring, in grading). A reduce-scatter is your ring's all-reduce, then a slice. A gather is your ring's
# all-reduce of the whole flat vector, zero except for this rank's shard. Its first half then sums zeros, so it
# sends twice the bytes of a real all-gather: that is the price of reusing q19 as it is.
#
# A `torch.autograd.Function` carries the two halves. Its `forward` gathers, computes, and saves only x; its
# `backward` gathers, recomputes, backpropagates and reduce-scatters. Recomputing keeps the gathered weights out of
# autograd's saved tensors. PyTorch's FSDP keeps the forward's graph instead and empties the copy's storage
# (`untyped_storage().resize_(0)`), refilling it before the backward. Either is accepted: the lab watches the
# copy's storage, so whatever keeps it alive (a `.detach()` of it included) counts as a gathered copy.
#
# The lab wraps every block of each replica's stage, runs your q12 1F1B step (the reference's, in grading),
# averages the replicated embedding and head, and takes the SGD step.
#
# The whole contract: `help(lab_src.exercises.fsdp_layer)`. The grader runs 2 and 4 data-parallel ranks and a
# 2 × 2 grid, three steps each. It compares every whole gradient with one process's (each block's rebuilt from
# every rank's shard). It also trains q13's digit classifier with your layers, on 2 and 4 replicas, and holds the
# loss to one process's curve, step for step. It measures the bytes the stage holds at rest. The lab watches every gathered copy, so it
# knows how many layers a rank holds at the peak and whether any outlives the step. It also counts gathers and
# reduce-scatters per layer.
#
# <details><summary><b>Hint</b>: weights from a flat vector (open it if you are stuck)</summary>
#
# Keep the names and shapes of `layer.named_parameters()` before you free them. Then
# `{name: full[a:b].view(shape)}` over consecutive ranges gives `functional_call` its weights. In the backward,
# make `full` require grad before cutting the views, and `torch.autograd.grad(y, (x, full), grad_y)` returns
# both gradients at once.
# </details>
#
# <details><summary><b>Hint</b>: memory that will not go (open it if you are stuck)</summary>
#
# `ctx.save_for_backward(full)` keeps every layer's gathered copy until its backward: at the end of the
# forward the rank holds all of them. Save only x, and gather again in the backward.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q22_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q22
import torch
from torch import nn
from torch.func import functional_call


def predicted_fsdp_bytes():
    """4 blocks of 12,704 float32 parameters on 4 ranks: bytes at rest and at a forward's peak; gathers for m = 8."""
    # return {"rest": ..., "peak": ..., "gathers": ...} with a number for each; "gathers": of one block
    ### BEGIN SOLUTION
    # at rest 4 shards of 12,704 / 4 elements; the peak adds one whole block; a block is gathered 2m times
    return {"rest": 50_816, "peak": 101_632, "gathers": 16}
    ### END SOLUTION


### BEGIN SOLUTION
class _Gathered(torch.autograd.Function):
    """The block's forward with gathered weights; its backward gathers again and reduce-scatters."""

    @staticmethod
    def forward(ctx, x, shard, module):
        ctx.module = module
        ctx.save_for_backward(x)
        full = module.dp.all_gather(shard.detach())
        return functional_call(module.block, module.weights(full), (x,))

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        module = ctx.module
        full = module.dp.all_gather(module.shard.detach()).requires_grad_()
        with torch.enable_grad():
            x_in = x.detach().requires_grad_(x.requires_grad)
            y = functional_call(module.block, module.weights(full), (x_in,))
            inputs = (x_in, full) if x.requires_grad else (full,)
            grads = torch.autograd.grad(y, inputs, grad_y)
        grad_x = grads[0] if x.requires_grad else None
        grad_shard = module.dp.reduce_scatter(grads[-1]) / module.dp.size
        return grad_x, grad_shard, None
### END SOLUTION


def fsdp_layer(layer, dp):
    ### BEGIN SOLUTION
    return ShardedLayer(layer, dp)
    ### END SOLUTION


### BEGIN SOLUTION
class ShardedLayer(nn.Module):
    def __init__(self, layer, dp):
        super().__init__()
        self.dp = dp
        self.shapes = [(name, p.shape, p.numel()) for name, p in layer.named_parameters()]
        flat = torch.cat([p.detach().reshape(-1) for p in layer.parameters()])
        self.shard = nn.Parameter(torch.tensor_split(flat, dp.size)[dp.rank].clone())
        for p in layer.parameters():
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)       # the whole weights: freed
        self._block = [layer]        # in a list, so that its emptied parameters are not this module's

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
        return _Gathered.apply(x, self.shard, self)
### END SOLUTION


# %% [markdown]
# ## Check
#
# The check wraps every block of a 2 × 2 grid's stages (two replicas of a 2-stage pipeline, 2 blocks a stage,
# each stage's replicas a group) and runs three steps of m = 4 micro-batches. Per rank it prints the bytes held
# at rest beside the replicated parameters and the shards, the peak of gathered bytes beside one layer's, the
# gathers and reduce-scatters per block and step, and whether the gradients equal one process's. Then it prints
# each number of your prediction, right or wrong, beside the default model's figure.

# %%
report = check("q22")

# %% [markdown]
# ## What your code did
#
# The run, its three steps: each rank's 1F1B step. The thin row under each rank holds the gathers and
# reduce-scatters your module asked for; they run inside the forward and backward boxes above them. Compare each
# box's length with q12's. How much of it is the gathering?
#
# The memory lane stacks what each rank holds when each of its operations ends: the parameters it keeps (the
# embedding or the head whole, the blocks' shards), the gathered whole weights still alive, and the gradients.
# A layer's gathered copy should appear at its gather and be gone when the box that used it ends.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q22_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q22 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q22")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q22")
### END HIDDEN TESTS
