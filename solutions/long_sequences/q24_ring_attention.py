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
# # Q24 · Long sequences: attention over a sequence split across ranks (ring attention, zigzag, Ulysses)
#
# *Exercise q24 of the pipeline-parallelism lab · 10 points*
#
# q23 cut what one block keeps for its backward; at long enough sequences even one block's activations no longer
# fit one device, and the sequence itself has to be split: **context parallelism**. Most of a transformer block acts
# on each position alone (the LayerNorms, the linear layers, the MLP), so N ranks can each hold S/N positions and
# compute them without talking. Attention cannot: every query needs every key before it. Two ways to bring them
# together:
#
# - **Ring attention** keeps each rank's queries where they are and sends the keys and values round a ring, as
#   your q19 ring sent its chunks: at each of N steps a rank computes its queries against the block it holds while
#   the next block travels towards it. Each step's result is a partial softmax, and partial softmaxes can be merged
#   exactly if each carries its log-sum-exp.
# - **Ulysses** (DeepSpeed) re-shards instead: one all-to-all turns "S/N positions of every head" into "every
#   position of H/N heads", each rank runs ordinary attention on its heads, and a second all-to-all turns the output
#   back. It needs at least as many heads as ranks.
#
# With a causal mask the ring has a catch: the rank that holds the first positions has almost nothing to compute,
# the one with the last positions the most. The **zigzag** layout (rank r holds chunks r and 2N − 1 − r of 2N)
# gives every rank one early and one late chunk.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.checks.q24_ring_attention import blocks_figure
from lab_src.topics.long_sequences.figure_attention import tiles_figure

# %% [markdown]
# ## The ring, before any run
#
# Cut the sequence into chunks and call one chunk of queries against one chunk of keys a **tile**. The figure
# shows a causal ring of N = 4 ranks: a row per rank, a column per step (which rank's K and V it holds then), and
# in each cell the tiles the rank computes. A tile in which every key comes after every query is all masked: it
# is skipped. With contiguous shards rank r skips every block from a later rank; with zigzag shards every rank
# computes half of each block it receives, and its own block whole.

# %%
tiles_figure(4)

# %% [markdown]
# ## Predict first
#
# One sequence of **S = 4,096 tokens, 32 heads of D = 128, bfloat16 (2 bytes), on N = P = 8 ranks**. Predict:
#
# - `"ring"`: the bytes one rank sends in the ring's **forward** (K and V; every block must reach every rank);
# - `"ulysses"`: the bytes one rank sends in Ulysses' forward (q, k, v to head shards, the output back; an
#   all-to-all keeps the rank's own piece);
# - `"contiguous"` and `"zigzag"`: the busiest rank's causal work over the mean work of the ranks, counted as the
#   figure draws it (a diagonal block is computed whole: a matmul does not skip half of its output).
#
#     return {"ring": ..., "ulysses": ..., "contiguous": ..., "zigzag": ...}
#
# in `predicted_traffic_and_balance()`, as numbers or arithmetic on numbers, in the answer cell below, before you
# run anything. They are graded, right within half a percent; the check prints each beside its value and the
# figure after it shows the balance your run measured.
#
# <details><summary><b>Hint</b>: what to count (open it if you are stuck)</summary>
#
# One rank's shard of K is (S/N)·H·D elements. In the ring, which blocks must leave a rank, and how many times does
# each block travel? In Ulysses, each of the four all-to-alls moves one shard-sized tensor, of which 1/P stays. For
# the balance, count the blocks of rank r in the figure, write it for any N, and divide the largest by the mean.
# </details>

# %% [markdown]
# ## Your task
#
# Write `ring_attention(q, k, v, causal, layout, group)`. q, k and v are this rank's rows of every head,
# (b, H, S/N, D), as torch's `scaled_dot_product_attention` takes them; it returns this rank's rows of the attention
# output, differentiable (a `torch.autograd.Function`: its backward returns dq, dk, dv).
#
# - **Layouts.** The sequence is cut into equal chunks. `"contiguous"`: N chunks, rank r holds chunk r.
#   `"zigzag"`: 2N chunks, rank r holds chunk r, then chunk 2N − 1 − r. A causal query at global position i sees the
#   keys at positions ≤ i: the mask compares global positions, whatever the layout. Another layout: ValueError.
# - **The ring.** Queries stay; K and V go round: each rank sends the block it holds to the next rank of the group
#   and receives the next block from the previous one, **posting that receive before it computes on the block it
#   holds**. Point-to-point messages only (`dist.isend`/`irecv` or `batch_isend_irecv` over `group`).
# - **Merging.** Each block gives, per query row, an output normalised by its own softmax sum and that sum's log
#   (the log-sum-exp). Merge the partial results exactly. A row that sees no key of a block gives output 0 and
#   log-sum-exp −inf, never NaN; blocks in which no query of the rank sees a key are not computed at all.
# - **Backward.** K and V go round again; the gradients dK and dV of each block travel round with it, each rank
#   adding its part, and arrive home, at the rank that holds the block.
# - **Ulysses**, in the same cell: `ulysses_attention(q, k, v, causal, group)`, same shapes, contiguous shards:
#   an all-to-all from sequence shards to head shards, attention whole per head (torch's SDPA is fine there), the
#   reverse all-to-all back (`dist.all_to_all_single`), and in the backward the same, reversed. With P ranks it
#   raises ValueError naming P and the number of heads when P > H or H % P ≠ 0.
#
# **Padding.** When S is no multiple of the chunks, the lab pads the sequence at its end with zero rows to the next
# multiple and judges the real rows only. Under a causal mask no real query sees a padded key, so your code needs
# no special case; non-causal runs always come on whole chunks.
#
# The lab records every message and collective, times every matmul each rank runs and counts its FLOPs; it judges
# the values against one process's `scaled_dot_product_attention` in float64 at N = 2, 3 and 4, the bytes each
# rank sends, the neighbours, and each rank's work against the tiles its queries can see. The whole contract:
# `help(lab_src.exercises.ring_attention)`.
#
# <details><summary><b>Hint</b>: merging two partial results (open it if you are stuck)</summary>
#
# With lse = logaddexp(lse₁, lse₂): out = out₁·exp(lse₁ − lse) + out₂·exp(lse₂ − lse). When both are −inf, lse is
# −inf too and both weights must be 0: compute the exponentials against a finite stand-in (0) wherever lse is −inf.
# </details>
#
# <details><summary><b>Hint</b>: the backward of one block (open it if you are stuck)</summary>
#
# Save q, k, v, the merged output and the merged log-sum-exp. For a block: P = exp(scores − lse) (masked scores
# give 0), dV += Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ out)), dQ += dS·K/√D, dK += dSᵀ·Q/√D. The dK, dV buffer of
# a block travels with it; after N steps one more send brings it home.
# </details>
#
# <details><summary><b>Hint</b>: zigzag without wasted work (open it if you are stuck)</summary>
#
# From an earlier rank, only the block's first chunk is visible, to both of your chunks, with no mask; from a later
# rank, only your second chunk sees the block, all of it, with no mask; your own block needs the causal mask.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q24_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q24
import torch
import torch.distributed as dist
import torch.nn.functional as F


def predicted_traffic_and_balance():
    """S = 4096, 32 heads of 128, bfloat16, N = P = 8: forward bytes per rank; busiest rank's causal work / mean."""
    # return {"ring": ..., "ulysses": ..., "contiguous": ..., "zigzag": ...} with a number for each
    ### BEGIN SOLUTION
    # ring: 2 (N - 1) (S/N) H D e; Ulysses: 4 (S/P) H D e (P - 1)/P; contiguous 2N/(N + 1); zigzag 1
    return {"ring": 2 * 7 * 512 * 32 * 128 * 2, "ulysses": 4 * 512 * 32 * 128 * 2 * 7 / 8,
            "contiguous": 16 / 9, "zigzag": 1.0}
    ### END SOLUTION


def ring_attention(q, k, v, causal, layout, group):
    ### BEGIN SOLUTION
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', not {layout!r}")
    return RingAttention.apply(q, k, v, causal, layout, group)


def positions(rank, n, rows, layout):
    """The global positions of the `rows` rows a rank holds: one chunk, or chunks rank and 2n - 1 - rank."""
    if layout == "contiguous":
        return torch.arange(rank * rows, (rank + 1) * rows)
    c = rows // 2
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * n - 1 - rank) * c, (2 * n - rank) * c)])


def visible(rank, src, n, rows, layout, causal):
    """The rows of this rank's queries and of src's keys worth computing (None: no key visible), and whether the
    causal mask is needed inside them. Contiguous: src's keys all come before this rank's queries (src < rank),
    all after (src > rank: skip), or the diagonal. Zigzag: src < rank, every query sees src's first chunk only;
    src > rank, only this rank's second chunk sees src's keys, all of them."""
    every = slice(0, rows)
    if not causal:
        return every, every, False
    if src == rank:
        return every, every, True
    if layout == "contiguous":
        return (every, every, False) if src < rank else None
    c = rows // 2
    return (every, slice(0, c), False) if src < rank else (slice(c, rows), every, False)


def scores(q, k, qpos, kpos, masked, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    if masked:
        s = s.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
    return s


def merge(out, lse, block_out, block_lse):
    """Two partial results of the same rows, each normalised by its own log-sum-exp, as one. A row that saw no key
    yet has lse -inf and output 0, and keeps them until a block shows it one."""
    new = torch.logaddexp(lse, block_lse)
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    out = out * torch.exp(lse - safe)[..., None] + block_out * torch.exp(block_lse - safe)[..., None]
    return out, new


def exchange(sends, recvs, group):
    """Post sends of `sends` to the next rank and receives of `recvs` from the previous one; the requests."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    ops = [dist.P2POp(dist.isend, t, group=group, group_peer=(rank + 1) % n) for t in sends]
    ops += [dist.P2POp(dist.irecv, t, group=group, group_peer=(rank - 1) % n) for t in recvs]
    return dist.batch_isend_irecv(ops) if ops else []


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group):
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        rows, scale = q.shape[-2], q.shape[-1] ** -0.5
        qpos = positions(rank, n, rows, layout)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype)
        kv = torch.stack([k, v]).contiguous()
        for step in range(n):
            if step < n - 1:                       # the next block's receive, posted before computing on this one
                nxt = torch.empty_like(kv)
                reqs = exchange([kv], [nxt], group)
            src = (rank - step) % n
            part = visible(rank, src, n, rows, layout, causal)
            if part is not None:
                qs, ks, masked = part
                s = scores(q[..., qs, :], kv[0][..., ks, :], qpos[qs], positions(src, n, rows, layout)[ks],
                           masked, scale)
                block_lse = torch.logsumexp(s, dim=-1)
                finite = torch.where(torch.isinf(block_lse), torch.zeros_like(block_lse), block_lse)
                block_out = torch.exp(s - finite[..., None]) @ kv[1][..., ks, :]
                out[..., qs, :], lse[..., qs] = merge(out[..., qs, :], lse[..., qs], block_out, block_lse)
            if step < n - 1:
                for r in reqs:
                    r.wait()
                kv = nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.layout, ctx.group = causal, layout, group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, layout, causal = ctx.group, ctx.layout, ctx.causal
        rank, n = dist.get_rank(group), dist.get_world_size(group)
        rows, scale = q.shape[-2], q.shape[-1] ** -0.5
        qpos = positions(rank, n, rows, layout)
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        finite_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)               # the gradient of the block held now, travelling with it
        for step in range(n):
            if step < n - 1:
                nxt = torch.empty_like(kv)
                reqs = exchange([kv], [nxt], group)
            src = (rank - step) % n
            part = visible(rank, src, n, rows, layout, causal)
            if part is not None:
                qs, ks, masked = part
                kb, vb = kv[0][..., ks, :], kv[1][..., ks, :]
                s = scores(q[..., qs, :], kb, qpos[qs], positions(src, n, rows, layout)[ks], masked, scale)
                p = torch.exp(s - finite_lse[..., qs, None])
                p = torch.where(torch.isinf(lse[..., qs, None]), torch.zeros_like(p), p)
                do = dout[..., qs, :]
                dkv[1][..., ks, :] += p.transpose(-2, -1) @ do
                ds = p * (do @ vb.transpose(-2, -1) - delta[..., qs, None])
                dq[..., qs, :] += (ds @ kb) * scale
                dkv[0][..., ks, :] += (ds.transpose(-2, -1) @ q[..., qs, :]) * scale
            if step < n - 1:
                for r in reqs:
                    r.wait()
                kv = nxt
            # the gradient goes on with its block: to the next rank, which holds that block next (after the last
            # step, the next rank is the block's own: it comes home)
            if n > 1:
                came = torch.empty_like(dkv)
                for r in exchange([dkv], [came], group):
                    r.wait()
                dkv = came
        return dq, dkv[0], dkv[1], None, None, None
    ### END SOLUTION


def ulysses_attention(q, k, v, causal, group):
    ### BEGIN SOLUTION
    p, heads = dist.get_world_size(group), q.shape[1]
    if p > heads or heads % p:
        raise ValueError(f"Ulysses gives each rank whole heads: {heads} heads cannot be dealt out evenly to "
                         f"P = {p} ranks (it needs P <= heads and heads % P == 0): use fewer ranks, or the ring")
    q, k, v = (SeqToHeads.apply(t, group) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return HeadsToSeq.apply(out, group)


def seq_to_heads(x, group):
    """(b, H, S/P, D), this rank's rows of every head -> (b, H/P, S, D), every row of this rank's heads."""
    p = dist.get_world_size(group)
    b, h, s, d = x.shape
    send = x.reshape(b, p, h // p, s, d).transpose(0, 1).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * s, d)


def heads_to_seq(x, group):
    """(b, H/P, S, D) -> (b, H, S/P, D): the reverse all-to-all."""
    p = dist.get_world_size(group)
    b, hp, S, d = x.shape
    send = x.reshape(b, hp, p, S // p, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send, group=group)
    return got.transpose(0, 1).reshape(b, hp * p, S // p, d)


class SeqToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return seq_to_heads(x, group)

    @staticmethod
    def backward(ctx, grad):
        return heads_to_seq(grad.contiguous(), ctx.group), None


class HeadsToSeq(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return heads_to_seq(x, group)

    @staticmethod
    def backward(ctx, grad):
        return seq_to_heads(grad.contiguous(), ctx.group), None
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs your ring on 4 ranks (contiguous and zigzag, causal and not, a sequence of 29: padded to 32) and on
# 3, and your Ulysses on 4 ranks and 3, plus once with 2 heads on 4 ranks, where it must refuse. Per run it prints
# the bytes each rank sent in the forward and the backward beside the formulas, each rank's forward work in blocks
# (S/N queries by S/N keys) and the busiest rank over the mean, beside the layout's figure; then your prediction,
# each number right or wrong.

# %%
report = check("q24")

# %% [markdown]
# ## What your run did
#
# Each rank's forward over time in the N = 4 runs, contiguous and zigzag: every matmul a box coloured by the ring's
# step (which block it was computing on), every receive a grey bar from posted to done, and each rank's work in
# blocks at the end of its row. With contiguous shards rank 3 computes four blocks while rank 0 computes one and
# waits; with zigzag every rank computes the same. On this CPU the ranks share two cores, so the boxes stretch and messages of
# a few kilobytes take milliseconds: the blocks are what the layout decides, the times what the machine adds.
#
# **Which to use when.** The ring sends 2(N − 1) shards of K and V per rank, Ulysses 4(P − 1)/P shards: at N = 8
# the ring sends four times the bytes, but its messages travel to one neighbour while the rank computes, and it has
# no limit on N. Ulysses' all-to-alls talk to every rank at once, cannot overlap its attention, and deal out whole
# heads: P ≤ H, and with grouped-query attention the few K/V heads bound it sooner. Its memory per rank is the whole
# sequence for H/P heads during the attention; the ring's is its shard plus the block in flight. Systems combine
# them: Ulysses within a node, the ring across nodes.

# %%
blocks_figure(report)

# %% nbgrader={"grade": true, "grade_id": "q24_hidden", "locked": true, "points": 10, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q24 (10 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q24")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q24")
### END HIDDEN TESTS
