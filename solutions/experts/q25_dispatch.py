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
# # Q25 · Mixture of experts: route, dispatch and combine with all-to-alls, the experts' gradients scaled
#
# *Exercise q25 of the pipeline-parallelism lab · 10 points*
#
# A mixture-of-experts layer replaces a block's one MLP by E of them, the *experts*, and a small *router* that
# sends each token to k of them. Every token still pays for k MLPs, not E: the model grows, its work per token
# does not. With **expert parallelism** the experts live on different ranks (here E / ep of them on each of ep
# ranks), so each MoE layer moves tokens twice: to the ranks of their experts (*dispatch*), and back (*combine*).
# How many go where depends on the data, so each rank first tells the others how many it will send: one
# all-to-all of counts, then one uneven all-to-all of the tokens themselves.
#
# Two quiet bugs follow this layout around. The experts' gradients arrive summed over the ep ranks whose tokens
# they saw (the all-to-all's backward does that), so the usual data-parallel average is wrong for them by a
# factor: no loss curve shows it at once. And an expert has a *capacity*: tokens over it are dropped, and which
# ones is a rule every rank must apply the same way.
#
# Here the lab's own decoder has each block's MLP replaced by E experts; you write the routing, the two
# all-to-alls, and the gradients' scaling, and the lab checks them against one process's MoE.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.checks.q25_dispatch import example_figure, traffic_figure

# %% [markdown]
# ## Tokens to experts and back
#
# The picture below routes one batch with the lab's rule on 4 ranks, 8 experts (2 per rank), k = 2, capacity
# factor 1.0, in this process (no ranks are started). Left: the rows each rank sends to each rank in the dispatch
# (the diagonal never leaves its rank); middle: the assignments each expert receives, against its capacity per
# source rank; right: the assignments each rank dropped.

# %%
example_figure()

# %% [markdown]
# ## Predict first
#
# Take ep = 4 ranks of experts, replicated over dp = 2 (8 ranks), T = 512 tokens per rank, k = 2, h = 64,
# float32, with every rank's assignments spread evenly over the experts and nothing dropped. **Predict the bytes one
# rank sends to other ranks in one MoE layer**: in the forward (dispatch and combine together) and in the backward.
# Count the tokens' rows only (the counts are a few bytes). Then: if `sync_gradients` sums each expert's gradient
# over its dp group and **divides by nothing**, by what factor is that gradient off from one process's?
#
#     return {"forward_bytes": ..., "backward_bytes": ..., "undivided_factor": ...}
#
# in `predicted_moe_traffic()` in the answer cell below, as numbers or arithmetic on numbers, before you run the
# check: it prints your numbers beside the grader's verdict. They are graded, right within half a percent.
#
# <details><summary><b>Hint</b>: what stays local (open it if you are stuck)</summary>
#
# A token's assignment to an expert on its own rank never leaves it: of T k assignments, spread evenly, a share
# (ep − 1)/ep goes elsewhere. What goes out in the dispatch comes back in the combine.
# </details>
#
# ## Your answer
#
# Read `dispatch`'s contract (`help(lab_src.dispatch)`): it also says what `route`, `combine` and `sync_gradients`
# must do. The lab calls them in each MoE layer of its model, on every rank:
#
#     routing = route(x, block.router, k, capacity_factor)        # x: (T, h), this rank's tokens
#     tokens, tokens_per_expert, meta = dispatch(x, routing, ep_group)
#     y = the rank's experts, each on its slice of tokens          # the lab's
#     out = combine(y, meta, ep_group)                             # (T, h), added to the residual
#
# and after the backward of the rank's mean loss, `sync_gradients(dense, experts, groups)`, then an SGD step.
# Use `torch.distributed.all_to_all_single` for both exchanges: the lab records every call with its split sizes
# (torch's functional collectives, `all_to_all_single_autograd` among them, go around the recorder: it would see
# none of your traffic).
#
# <details><summary><b>Hint</b>: the all-to-all under autograd</summary>
#
# `dist.all_to_all_single` has no backward. Wrap it in a `torch.autograd.Function` whose backward sends the
# gradient back the way the rows came (the split sizes swapped).
# </details>
#
# <details><summary><b>Hint</b>: which factor for which parameters</summary>
#
# Write the gradient of the mean over all ranks' tokens as a sum over ranks of each rank's mean, divided by the
# number of ranks. Then ask, for one expert on one rank, which ranks' terms its `.grad` already holds after the
# backward, and which it still lacks.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q25_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q25
import math

import torch
import torch.distributed as dist

from lab_src.topics.experts.moe import Routing


def predicted_moe_traffic():
    """ep = 4 (dp = 2), T = 512 tokens per rank, k = 2, h = 64, float32, spread evenly, nothing dropped."""
    # return {"forward_bytes": ..., "backward_bytes": ..., "undivided_factor": ...} with a number for each
    ### BEGIN SOLUTION
    # dispatch and combine each send T k (ep - 1)/ep rows of h float32 elements
    return {"forward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4, "backward_bytes": 2 * 512 * 2 * 3 / 4 * 64 * 4,
            "undivided_factor": 4 * 2}
    ### END SOLUTION


def route(x, router, k, capacity_factor):
    ### BEGIN SOLUTION
    probs = torch.softmax(router(x), dim=-1)
    weights, experts = torch.topk(probs, k, dim=-1)
    E = router.out_features
    keep = torch.ones_like(experts, dtype=torch.bool)
    if capacity_factor:
        cap = math.ceil(capacity_factor * x.shape[0] * k / E)
        taken = [0] * E
        for j in range(k):                       # every first choice, then every second choice
            for t in range(x.shape[0]):
                e = int(experts[t, j])
                if taken[e] < cap:
                    taken[e] += 1
                else:
                    keep[t, j] = False
    return Routing(experts, weights, keep, E)
    ### END SOLUTION


def dispatch(x, routing, ep_group):
    ### BEGIN SOLUTION
    ep = dist.get_world_size(ep_group)
    E = routing.num_experts
    L = E // ep
    token = torch.arange(x.shape[0]).unsqueeze(1).expand_as(routing.experts)
    kept = routing.keep
    expert, rows = routing.experts[kept], token[kept]
    order = torch.argsort(expert, stable=True)            # by expert, so by destination rank too
    expert, rows = expert[order], rows[order]
    weights = routing.weights[kept][order]
    send = torch.bincount(expert, minlength=E).view(ep, L)    # [rank j, its expert l]: rows this rank sends
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=ep_group)    # [rank j, my expert l]: rows rank j sends me
    send_rows, recv_rows = send.sum(1).tolist(), recv.sum(1).tolist()
    got = AllToAll.apply(x[rows], send_rows, recv_rows, ep_group)   # by source rank, then local expert
    pieces = list(torch.split(got, recv.flatten().tolist()))
    by_expert = [j * L + l for l in range(L) for j in range(ep)]
    tokens = torch.cat([pieces[i] for i in by_expert])
    meta = {"rows": rows, "weights": weights, "send_rows": send_rows, "recv_rows": recv_rows,
            "sizes": [pieces[i].shape[0] for i in by_expert], "by_expert": by_expert, "T": x.shape[0]}
    return tokens, recv.sum(0).tolist(), meta


class AllToAll(torch.autograd.Function):
    """Rows to each rank of the group (`send` of them to rank j), as many from each (`recv`); the backward sends the
    gradients back the way the rows came."""

    @staticmethod
    def forward(ctx, x, send, recv, group):
        ctx.send, ctx.recv, ctx.group = send, recv, group
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), ctx.send, ctx.recv, group=ctx.group)
        return out, None, None, None
    ### END SOLUTION


def combine(y, meta, ep_group):
    ### BEGIN SOLUTION
    pieces = torch.split(y, meta["sizes"])
    by_source = [None] * len(pieces)
    for piece, i in zip(pieces, meta["by_expert"]):
        by_source[i] = piece
    back = AllToAll.apply(torch.cat(by_source), meta["recv_rows"], meta["send_rows"], ep_group)
    out = y.new_zeros((meta["T"], y.shape[1]))
    return out.index_add(0, meta["rows"], meta["weights"].unsqueeze(1) * back)
    ### END SOLUTION


def sync_gradients(dense, experts, groups):
    ### BEGIN SOLUTION
    world = groups.ep_size * groups.dp_size
    for p in dense:                  # every rank's own tokens: the mean over all ranks
        dist.all_reduce(p.grad, group=groups.world)
        p.grad /= world
    for p in experts:                # the all-to-all's backward summed the ep ranks' terms: divide, and average over dp
        dist.all_reduce(p.grad, group=groups.dp)
        p.grad /= groups.ep_size * groups.dp_size
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs the lab's MoE model (2 layers, float64) on 2 ranks with one expert each and a capacity that drops
# some assignments, then on 4 ranks (ep = 2, dp = 2, two experts each, k = 2) where one rank of experts receives no
# token. For each it compares your outputs, gradients and three SGD steps with one process's MoE, counts your
# all-to-alls per layer and their bytes against what the routing sends off-rank, and compares the dropped
# assignments with the rule. Then your prediction, each number right or wrong.

# %%
report = check("q25")

# %% [markdown]
# ## What your run sent
#
# From the first case's record: the rows each rank sent to each rank in the first layer's dispatch, the load on
# each expert, and what was dropped, drawn from what the lab recorded of your all-to-alls and your routing.

# %%
traffic_figure(report)

# %% [markdown]
# The same run in time: each rank's collectives, per step (the all-to-alls of the forward, those of the backward,
# then the all-reduces of your `sync_gradients`). A rank waits in an all-to-all until every rank of its group has
# come: the slowest rank's routing sets the pace of all of them.

# %%
report.timeline()

# %% nbgrader={"grade": true, "grade_id": "q25_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q25 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q25")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q25")
### END HIDDEN TESTS
