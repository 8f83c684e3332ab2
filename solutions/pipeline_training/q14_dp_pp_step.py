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
# # Q14 · Data x pipeline parallel on a grid of ranks, tied embeddings
#
# *Exercise q14 of the pipeline-parallelism lab · 20 points*
#
# A pipeline splits the *model* across ranks; data parallelism splits the *batch*. Real training runs
# combine them: each data-parallel replica is a whole pipeline, and the replicas train on different
# samples with the same weights. With `dp` replicas of a `pp`-stage pipeline you need `dp × pp` ranks,
# and one optimizer step sees
#
#     global batch = micro-batch size × micro-batches × dp
#
# Picture the ranks as a grid with one row per replica and one column per stage. Every rank then has two
# coordinates, and two kinds of neighbours:
#
# - along its **row** (its pipeline): the previous and next stage, to which activations and gradients
#   travel point to point, as in Q7 and Q8;
# - along its **column** (its data-parallel set): the ranks that hold the *same* layers in the other
#   replicas. After the backward, they average their gradients with an **all-reduce**, so that every
#   replica takes the same optimizer step.
#
# Frameworks keep this bookkeeping in a small "process group manager": from the global rank it works out
# the coordinates and builds one process group per row and one per column. You write one here.
#
# **Seeds, as Q1 argued.** The replicas must start from the *same* weights (this lab seeds each model piece
# from the run seed and the piece's name, so the same `cfg` gives the same weights on every replica) but
# read *different* data: each replica's samples come from a stream seeded by the run seed and its
# data-parallel coordinate, `make_dataloader(cfg, micro_batch_size, dp_rank=dp_rank)`. Give two replicas
# the same data seed and they compute the same gradients: you pay for two replicas and train on one.
#
# **Tied embeddings.** Many language models reuse the input embedding (vocab × hidden) as the output
# projection. In a pipeline the embedding lives on the first stage and the projection on the last, so both
# hold a *copy* (`stage.tied_embedding`). Each copy's gradient covers only its own use; the true gradient
# is their sum. After the backward, the first and last stage of every pipeline all-reduce that gradient
# (a sum over a group of just those two ranks), so that both copies take the same step and stay equal.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# ## The grid, in numbers
#
# The layout every answer uses is the one of `torch.arange(world_size).view(dp, pp)`:
#
#     global rank = dp_rank × pp + pp_rank
#
# With 2 replicas of a 2-stage pipeline:
#
# | rank | dp_rank | pp_rank | its pipeline | its data-parallel set | its tied pair |
# |---|---|---|---|---|---|
# | 0 | 0 | 0 | [0, 1] | [0, 2] | [0, 1] |
# | 1 | 0 | 1 | [0, 1] | [1, 3] | [0, 1] |
# | 2 | 1 | 0 | [2, 3] | [0, 2] | [2, 3] |
# | 3 | 1 | 1 | [2, 3] | [1, 3] | [2, 3] |
#
# With two stages a tied pair is the whole pipeline; with four (1 × 4) it is ranks 0 and 3, and with one
# stage (4 × 1) there is no pair at all: the embedding and the projection are one parameter on one rank.
#
# A process group is created *collectively*: every rank calls `grid.new_group(ranks)` for *every* group,
# in the same order, even the groups it is not a member of, and keeps the ones it belongs to.

# %% [markdown]
# ## First, predict the traffic
#
# Before you run anything, predict how many bytes one step sends on the 2 × 2 grid the check runs first:
# `lab_src.topics.dp_pp.traffic.PREDICTION_CONFIG`, that is 4 blocks (hidden 32, 4 heads, sequence 16,
# vocabulary 64), global batch 24, 3 micro-batches per replica, 2 replicas of a 2-stage pipeline, tied
# embeddings, float32 (4 bytes a number). Count, summed over all four ranks:
#
# - `"pipeline"`: the bytes of every point-to-point send (activations forward, their gradients back);
# - `"data_parallel"`: the bytes of the gradients each rank hands to its data-parallel all-reduce;
# - `"tied"`: the bytes of the tied embedding's gradient each first and last stage hands to its all-reduce.
#
# The cell below counts the parameters of each piece of the model for you. Write your prediction in
# `predicted_bytes()` in the answer cell, as `return {"pipeline": ..., "data_parallel": ..., "tied": ...}`
# with numbers (or arithmetic on numbers: `2 * 3 * 8192` is fine; names and calls are not). It is graded,
# read from your answer cell without running it, and the check prints it next to what your step sent.

# %%
from lab_src import build_model
from lab_src.topics.dp_pp.traffic import PREDICTION_CONFIG

_model = build_model(PREDICTION_CONFIG.replace(tie_embeddings=False))
for _name, _piece in [("embed", _model.embed), ("one block", _model.blocks[0]), ("head", _model.head)]:
    print(f"{_name:>10}: {sum(p.numel() for p in _piece.parameters()):6,} parameters")
print("with tied embeddings, the head's (vocab x hidden) projection is a copy of the embedding's token table")

# %% [markdown]
# ## Your task
#
# Write `dp_pp_step(grid, cfg)`: one training step of this rank on the grid, returning
# `(stage, outputs, loss)`. `grid` tells you `rank`, `world_size`, `dp_size`, `pp_size` and `device`, and
# gives you two operations: `grid.new_group(ranks)`, and `grid.all_reduce(tensor, group, kind, op="sum")`
# (`op="avg"` averages; `kind` is `"dp"` or `"tied"`, what the reduction is for: the grid records it).
#
# The goal: after your step, every replica holds the gradients of the *global* batch, exactly those of the
# single process that ran the whole model on all of it, and the two copies of the tied embedding hold
# equal gradients. The contract:
#
# - ranks are numbered `rank = dp_rank * pp_size + pp_rank`: a pipeline is `pp_size` consecutive ranks;
# - each replica runs your Q8 step (`afab_step`) on its own shard of the global batch, in
#   `cfg.num_microbatches` micro-batches, through a `PipelineStage` that talks within its own pipeline;
# - every group is created by every rank, in the same order (a collective waits for all its members);
# - the tied embedding's gradient is summed over the first and last stage of a pipeline, and every gradient
#   averaged over the ranks that hold the same stage;
# - return `(stage, outputs, loss)`: your stage, and what `afab_step` returned. `help(lab_src.dp_pp_step)`
#   has the full contract.
#
# <details><summary><b>Hint</b>: the step in seven moves, with the calls (open it if you are stuck)</summary>
#
# 1. Coordinates: `dp_rank, pp_rank` from `grid.rank`.
# 2. Groups, created by every rank in the same order: one per pipeline, one per data-parallel set, and
#    (tied embeddings, more than one stage) one per pipeline of its first and last rank.
# 3. Your stage: `PipelineStage(cfg, pp_rank, pp_size, micro_batch_size, grid.device, your_pipeline_group)`;
#    a replica's micro-batch size is `cfg.global_batch_size // (dp_size * cfg.num_microbatches)`.
# 4. Data on the stages that need it (Q6): `make_dataloader(cfg, micro_batch_size, dp_rank=dp_rank)`.
# 5. The step: `afab_step(stage, data_iter, cfg.num_microbatches)` (your Q8).
# 6. The tied embedding's gradient (`stage.tied_embedding.grad`, first and last stage only): summed over
#    the first and last stage of your pipeline.
# 7. Every gradient of your stage: averaged over your data-parallel set.
#
# </details>

# %% nbgrader={"grade": false, "grade_id": "q14_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q14
import torch

from lab_src import PipelineStage, afab_step, make_dataloader, needs_dataloader


def predicted_bytes():
    """Bytes one step of PREDICTION_CONFIG sends, by kind, summed over all ranks: numbers only."""
    ### BEGIN SOLUTION
    return {"pipeline": 2 * 2 * 1 * 3 * (4 * 16 * 32 * 4),          # dp x (forward + back) x boundaries x m x activation
            "data_parallel": 2 * (2560 + 2 * 12704 + 2 * 12704 + 2176) * 4,   # dp x (both stages, tied copy in the head)
            "tied": 2 * 2 * 64 * 32 * 4}                           # dp x (first + last) x vocab x hidden
    ### END SOLUTION


def dp_pp_step(grid, cfg):
    """One step of this rank on a dp x pp grid; returns (stage, outputs, loss)."""
    ### BEGIN SOLUTION
    dp, pp = grid.dp_size, grid.pp_size
    dp_rank, pp_rank = divmod(grid.rank, pp)          # rank = dp_rank * pp + pp_rank
    # every rank creates every group, in the same order
    pipelines = [grid.new_group([d * pp + p for p in range(pp)]) for d in range(dp)]
    dp_sets = [grid.new_group([d * pp + p for d in range(dp)]) for p in range(pp)]
    tied_pairs = [grid.new_group([d * pp, d * pp + pp - 1]) for d in range(dp)] if cfg.tie_embeddings and pp > 1 else []

    micro_batch_size = cfg.global_batch_size // (dp * cfg.num_microbatches)
    stage = PipelineStage(cfg, pp_rank, pp, micro_batch_size, grid.device, pipelines[dp_rank])
    data = None
    if needs_dataloader(pp_rank, pp):                 # this replica's own shard: its own data seed
        data = iter(make_dataloader(cfg, micro_batch_size, dp_rank=dp_rank))
    outputs, loss = afab_step(stage, data, cfg.num_microbatches)

    if tied_pairs and stage.tied_embedding is not None:   # both uses' gradients, on both copies
        grid.all_reduce(stage.tied_embedding.grad, tied_pairs[dp_rank], "tied")
    if dp > 1:                                        # one buffer for all gradients (a single message)
        grads = [p.grad for p in stage.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads])
        grid.all_reduce(flat, dp_sets[pp_rank], "dp", op="avg")
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
    return stage, outputs, loss
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks run your step as 2 replicas of a 2-stage pipeline, then as one 4-stage pipeline
# (1 × 4) and as 4 replicas of a single stage (4 × 1), with tied embeddings. For each grid the check
# compares every rank's gradients, and the last stages' outputs and losses, with the single-process
# baseline of the global batch (your Q4), checks the groups your all-reduces ran over and the shards your
# replicas read, takes one SGD step and checks that the tied copies stayed equal, and counts the bytes by
# kind, next to your prediction.

# %%
report = check("q14")

# %% [markdown]
# ## What your code did
#
# Your 2 × 2 run: every rank's forward and backward boxes, each message an arrow, and the all-reduces at
# the end (purple: data-parallel, pink: tied), joined across the ranks that took part.

# %%
report.timeline()

# %% [markdown]
# The same events open in Perfetto (ui.perfetto.dev) as a Chrome trace, all-reduces included:
# `report.chrome_trace("q14_trace.json")` writes it.
#
# ## What the traffic costs: a what-if model
#
# A network moves a message of `b` bytes in about `latency + b / bandwidth`. A **ring all-reduce** over `n`
# ranks cuts the buffer into `n` pieces and passes them round the ring twice (`n - 1` steps to add the
# pieces up, `n - 1` to hand the sums round): every rank sends `2(n - 1)/n` of the buffer, in `2(n - 1)`
# steps that each pay the latency, at the speed of the ring's slowest link.
#
# `what_if` applies this model to every operation your 2 × 2 step recorded, on two networks: this machine's
# (latency and bandwidth from a ping-pong the check timed between two ranks) and a cluster you describe.
# Next to them is what the operations took in your run (a message: from its send to the end of its
# receive; an all-reduce: from the moment the last rank joined until the last one left), for the rank that
# spent the most time on each kind.
#
# Expect the measurement to be far above this machine's prediction: four processes share a couple of CPU
# cores, so most of a measured message is a rank waiting to be scheduled, not bytes on the wire. The model
# describes the wire; the measurement describes everything. Then look at the plot: what the same pipeline
# would cost on your cluster with more replicas (left), or with its batch cut into more micro-batches
# (right). Change the cluster (slower links between nodes, more ranks per node) and find where the
# pipeline's point-to-point traffic is cheaper than data parallelism's all-reduce, and where it is not.

# %%
from lab_src.checks.q14_dp_pp_step import what_if

what_if(report, nodes=2, ranks_per_node=4, intra_gbps=800, inter_gbps=100, intra_latency_us=3, inter_latency_us=15)

# %% nbgrader={"grade": true, "grade_id": "q14_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q14 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q14")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q14")
### END HIDDEN TESTS
