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
# # Q1 · Seeds: the same on every rank, or different?
#
# *Exercise q01 of the pipeline-parallelism lab · 12 points, graded by hand*
#
# Every process of a distributed job draws random numbers: to initialise weights, to shuffle data, for
# dropout. Whether two ranks should draw the *same* numbers depends on what the two ranks are supposed to
# hold. Getting it wrong does not crash anything; it silently trains a different model than you think.
#
# In this lab we keep things simple: every rank uses the same seed, and a pipeline stage builds only its
# own layers with a seed derived from the layer's name (more on that below), so each stage gets exactly
# the weights the whole model would have. Your answers below are about real training, where pipeline,
# data and tensor parallelism are combined.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# ## A small experiment in four processes
#
# `demo_seeds()` starts `torchrun` with 4 ranks. Each rank draws the first numbers of a weight "shard"
# twice: once after `torch.manual_seed(seed)` and once after `torch.manual_seed(seed + rank)`. Then each
# builds block 3 of the lab's model the way a pipeline stage would. Last, each picks the first samples
# it would train on, in two ways: from a shuffle of its own, seeded with `seed`, or from its slice of one
# shuffle that all ranks share (as PyTorch's `DistributedSampler` does).

# %%
from lab_src.checks import demo_seeds
from lab_src.views.pictures import seeds_figure
seeds = demo_seeds()

# %% [markdown]
# The same run as a picture: one row per way of drawing, one box per rank. Boxes of one colour hold the
# same numbers.

# %%
seeds_figure(seeds)

# %% [markdown]
# What to notice:
#
# - With the same seed, all four ranks produced the same numbers. If these were four shards of one
#   weight matrix (tensor parallelism), the matrix would consist of four identical blocks: a poor
#   initialisation that training may never undo.
# - With `seed + rank`, the shards differ, as shards should. But anything that must be *identical* across
#   these ranks (a replicated LayerNorm, or a model replica in data parallelism) would now differ.
# - Block 3 came out the same on every rank. The lab seeds each piece of the model from the run seed and
#   the piece's name (`lab_src.pipeline.model.piece_seed`), so it does not matter which rank builds it.
# - With a shuffle of their own from the same seed, all ranks would train on the same samples: four
#   replicas doing the work of one. Slicing one shared shuffle gives each rank different samples, and
#   together they still see every sample once.

# %% [markdown]
# ## Questions
#
# Answer in a few sentences each, in the cells below. Say *why*, not only *same* or *different*.
#
# **1.** Across the ranks of the **pipeline-parallel** dimension (stage 0, stage 1, …), should the seed
# be the same or different?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q01_pipeline", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# Different (or, equivalently, seeded per layer). The stages hold different layers, so nothing needs to
# match between them. With one shared seed and each stage initialising "its first layer" from the same
# random stream, layer 0 of stage 0 and layer 0 of stage 1 would start with identical weights:
# correlated layers the unsharded model would never have. Offsetting the seed by the pipeline rank, or
# deriving it from the global layer index as this lab does, gives every layer its own weights. Dropout
# masks on different stages act on different activations, so they need not match either.

# %% [markdown]
# **2.** Across the ranks of the **data-parallel** dimension (replicas that see different data), should
# the seed be the same or different?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q01_data", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# The same for the parameters: data-parallel ranks are replicas of one model, and all-reducing gradients
# only keeps them in step if they start from identical weights (otherwise rank 0's weights would have to
# be broadcast at start). Different for everything per-sample: each replica must read different samples
# (a distributed sampler with a shared seed and the rank as offset) and should draw different dropout
# masks, otherwise the replicas repeat each other's randomness and the effective batch is less random.

# %% [markdown]
# **3.** Across the ranks of the **tensor-parallel** dimension, should the seed be the same or different?
# *Hint:* tensor parallelism shards most linear layers, but not the LayerNorms.

# %% [markdown] nbgrader={"grade": true, "grade_id": "q01_tensor", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# Both, depending on the parameter. Sharded weights (each rank holds a slice of a linear layer) need
# different random numbers on each rank, or the full matrix is made of repeated blocks. Replicated
# parameters (LayerNorm weights and biases, and anything else every tensor-parallel rank holds in full)
# must be identical on all ranks, so they need the same seed. Dropout follows the same rule: different
# inside the sharded region, identical on replicated activations.

# %% [markdown]
# **4.** Now combine all three. Do your answers contradict each other? How could a framework resolve it?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q01_combined", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# Yes: one process is at the same time a data-parallel replica (wants the same seed as its replicas), a
# tensor-parallel shard (wants a different seed for sharded weights, the same for replicated ones) and a
# pipeline stage (wants a seed of its own). A single global seed cannot satisfy all of this. Frameworks
# keep several random-number streams: a default stream seeded identically across data- and
# tensor-parallel ranks (offset by the pipeline rank), and a separate "model-parallel" stream seeded with
# the tensor-parallel rank, switched to when initialising sharded weights or drawing dropout inside
# sharded regions (Megatron-LM's RNG tracker does this). Another way out is to make initialisation
# independent of the process layout: generate each weight from a seed derived from its global name and
# index (as this lab does), or initialise once and broadcast.
