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
# # Q15 · Interleaved 1F1B with virtual stages
#
# *Exercise q15 of the pipeline-parallelism lab · 20 points*
#
# One-Forward-One-Backward (1F1B) keeps every rank's memory bounded, but its bubble is the same as
# AFAB's: at the start of a step rank p-1 waits for micro-batch 0 to cross p-1 stages, and at the end
# rank 0 waits for the last gradient to come back. Here is 1F1B with 4 ranks and 4 micro-batches, each box
# one stage's forward (`F`) or backward (`B`) of a micro-batch, all boxes the same length:
#
# ```
# rank 0 | F0 F1 F2 F3  .  .  . B0  . B1  . B2  . B3
# rank 1 |  . F0 F1 F2  .  . B0 F3 B1  . B2  . B3  .
# rank 2 |  .  . F0 F1  . B0 F2 B1 F3 B2  . B3  .  .
# rank 3 |  .  .  . F0 B0 F1 B1 F2 B2 F3 B3  .  .  .
# ```
#
# The idle share is (p-1)/(m+p-1) = 3/7. The ramp at each end is p-1 boxes long, and a box is a
# whole stage's worth of layers. **Interleaving makes the boxes smaller.** Cut the model into
# v·p *virtual stages* instead of p, and deal them out round-robin: rank r holds v *chunks*, chunk c being
# virtual stage c·p + r. With p = 4 ranks and v = 2 chunks per rank:
#
# | virtual stage | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |
# |---|---|---|---|---|---|---|---|---|
# | rank, chunk | 0, 0 | 1, 0 | 2, 0 | 3, 0 | 0, 1 | 1, 1 | 2, 1 | 3, 1 |
#
# A micro-batch now goes round the ring of ranks twice. After virtual stage 3 (rank 3, chunk 0) comes
# virtual stage 4 on rank 0: the activation **wraps around from the last rank to the first**, and in the
# backward its gradient goes from rank 0 back to rank 3. A box is now half a stage (`F`/`B` chunk 0,
# `f`/`b` chunk 1):
#
# ```
# rank 0 | F0 F1 F2 F3 f0 f1 f2 f3  .  .  . b0  . b1  . b2  . b3 B0 B1 B2 B3
# rank 1 |  . F0 F1 F2 F3 f0 f1 f2 f3  . b0  . b1  . b2  . b3 B0 B1 B2 B3  .
# rank 2 |  .  . F0 F1 F2 F3 f0 f1 f2 b0 f3 b1  . b2  . b3 B0 B1 B2 B3  .  .
# rank 3 |  .  .  . F0 F1 F2 F3 f0 b0 f1 b1 f2 b2 f3 b3 B0 B1 B2 B3  .  .  .
# ```
#
# The ramps are still p-1 boxes, but the boxes are half as long: 22 half-stage boxes are 11 stage boxes
# against 1F1B's 14. In general the idle time is (p-1)/v stages' worth against m stages' worth of work
# per rank, so the **idle share of the step is (p-1)/(v·m+p-1)**: 3/11 here.
#
# **The order.** Each rank takes a *group* of p micro-batches through chunk 0, then the same group
# through chunk 1, and so on, then the next group; backwards visit the chunks in reverse (the last
# chunk first, because the gradient starts at the end of the model). By the time rank 0 has pushed
# micro-batches 0..p-1 through chunk 0, micro-batch 0 has travelled round the ring and is back for
# chunk 1: no rank waits. This is why the number of micro-batches must be a multiple of p. Rank r first
# runs (p-r-1)·2 + (v-1)·p forwards (at most m·v: Megatron-LM's warm-up), then alternates one forward
# and one backward, then runs the remaining backwards.
#
# **The price.** Every micro-batch crosses v·p-1 boundaries between virtual stages instead of p-1, so a
# step sends about v times as many messages (of the same size). And the warm-up holds more: rank 0 keeps
# (p-1)·2 + (v-1)·p + 1 chunk forwards waiting for their backward, each 1/v of its layers, that is about
# (2(p-1) + (v-1)p + 1)/v = p + (p-1)/v stages' worth of activations against p for 1F1B (5.5 against 4
# for p = 4, v = 2), and they belong to more micro-batches at once.

# %%
# %load_ext lab_src
from lab_src.checks import check

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q15`
# is yours: running it defines your function here *and* saves it to `answers/q15_interleaved_step.py` next to
# this notebook. The check below it starts real `torchrun` processes, and each of them loads that file, so
# always re-run your answer cell after editing it. Keep the answer cell self-contained (its own imports and
# helpers): the grader runs it on its own.
#
# ## Your task
#
# Write `interleaved_step(stage, data_iter, num_microbatches)`. `stage` is an `InterleavedStage`: the chunks
# of rank `stage.pp_rank` of `stage.pp_size`, `stage.num_chunks` of them. What it offers:
#
# | | |
# |---|---|
# | `stage.forward(x, chunk=c, microbatch=mb)` | the forward of chunk c; returns its output |
# | `stage.backward(x, y, grad, chunk=c, microbatch=mb)` | back-propagates `grad` (None for the loss) through chunk c; returns the gradient of `x` |
# | `stage.send(tensor, dst=rank, operation=op, microbatch=mb, chunk=c)` | posts a message (returns at once) |
# | `stage.recv(src=rank, shape=stage.activation_shape, operation=op, microbatch=mb, chunk=c)` | waits for a message and returns it |
# | `stage.post_recv(...)`, the arguments of `recv` | posts the receive and returns at once; its `.wait()` returns the message |
#
# `op` is one of Q7's four operations. Q7's `pipeline_communicate` does not know about chunks: write the
# chunk-aware version inside your answer (which virtual stage is chunk c? which rank holds the next one and
# the previous one? which operations do nothing at the two ends of the *model*?). Then the step, as in Q8:
# virtual stage 0 reads its micro-batches of tokens from `data_iter`; received activations need
# `requires_grad_()`; the loss of a micro-batch is the mean of the last virtual stage's output divided by
# `num_microbatches`; keep each chunk's input and output until its backward. Return `(outputs, loss)`: on the
# last rank each micro-batch's output (detached, in micro-batch order) and the total loss as a float; on
# the others `([], None)`.
#
# **Predict, then run (graded).** Before you run anything, fill in `predicted_interleaving()` at the end of
# the answer cell: for p = 4 ranks and m = 8 micro-batches, with all boxes equal, the idle share of a step
# and the number of messages one step sends (over all ranks), for v = 1, 2 and 4 chunks per rank. Numbers
# and arithmetic only (`1 / 3`, `2 * 5`): the grader reads them without running your code, and the
# check and the bubble study below put them beside what the schedule does.
#
# `stage.recv` is all you need. `post_recv` is for later, once the step is right: gloo starts moving a
# message only when its receive is posted, so a `recv` called when its box is about to run makes the box
# wait for the whole transfer. Post each box's receive one box ahead, and the message travels while the box
# before it computes; this is what `torch.distributed.pipelining`'s schedules do. Keep the receives from one
# rank in the order its sends go out: messages between two ranks land in the receives in the order those
# were posted.

# %% nbgrader={"grade": false, "grade_id": "q15_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q15
def interleaved_step(stage, data_iter, num_microbatches):
    """One Interleaved 1F1B step of this rank's chunks; returns (outputs, loss)."""
    ### BEGIN SOLUTION
    p, r, v, m = stage.pp_size, stage.pp_rank, stage.num_chunks, num_microbatches
    first, last = 0, v * p - 1                      # the virtual stages that begin and end the model

    def virtual(chunk):                             # rank r holds chunks r, r + p, r + 2p, ...
        return chunk * p + r

    def order(k, backward):
        """(micro-batch, chunk) of this rank's k-th forward (or backward)."""
        group, pos = divmod(k, p * v)               # groups of p micro-batches, each through all v chunks
        mb, chunk = group * p + pos % p, pos // p
        return mb, (v - 1 - chunk if backward else chunk)

    def communicate(op, chunk, mb, tensor=None):
        """Q7's four operations for one chunk; the ring's neighbours are (r - 1) % p and (r + 1) % p.
        A receive is posted here and returned; its .wait() gives the tensor."""
        s = virtual(chunk)
        if op == "recv_forward" and s != first:
            return stage.post_recv(src=(r - 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb,
                                   chunk=chunk)
        if op == "send_forward" and s != last:
            stage.send(tensor, dst=(r + 1) % p, operation=op, microbatch=mb, chunk=chunk)
        if op == "recv_backward" and s != last:
            return stage.post_recv(src=(r + 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb,
                                   chunk=chunk)
        if op == "send_backward" and s != first:
            stage.send(tensor, dst=(r - 1) % p, operation=op, microbatch=mb, chunk=chunk)
        return None

    kept, logits, losses = {}, {}, []

    def forward(k, received):
        mb, chunk = order(k, backward=False)
        if received is None:                        # virtual stage 0: tokens from the dataloader
            x = next(data_iter).to(stage.device)
        else:
            x = received.wait().requires_grad_()
        y = stage.forward(x, chunk=chunk, microbatch=mb)
        communicate("send_forward", chunk, mb, y)
        if virtual(chunk) == last:
            logits[mb] = y.detach()
            y = y.mean() / m                        # this micro-batch's share of the batch mean
            losses.append(float(y.detach()))
        kept[mb, chunk] = (x, y)

    def backward(k, received):
        mb, chunk = order(k, backward=True)
        grad = received.wait() if received is not None else None    # None: the last virtual stage's loss
        x, y = kept.pop((mb, chunk))
        input_grad = stage.backward(x, y, grad, chunk=chunk, microbatch=mb)
        communicate("send_backward", chunk, mb, input_grad)

    def receive_for(box):
        """Post the receive that a box (forward or backward k) will need; None if it needs none."""
        run, k = box
        backward_box = run is backward
        mb, chunk = order(k, backward=backward_box)
        return communicate("recv_backward" if backward_box else "recv_forward", chunk, mb)

    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    boxes = [(forward, k) for k in range(warmup)]                   # warm-up
    for i in range(total - warmup):
        boxes += [(forward, warmup + i), (backward, i)]             # one forward, one backward
    boxes += [(backward, k) for k in range(total - warmup, total)]  # cool-down
    # Each box's receive is posted one box ahead, so its message travels while the box before computes.
    received = receive_for(boxes[0])
    for i, (run, k) in enumerate(boxes):
        after = receive_for(boxes[i + 1]) if i + 1 < len(boxes) else None
        run(k, received)
        received = after
    if stage.is_last_stage:
        return [logits[mb] for mb in range(m)], sum(losses)
    return [], None
    ### END SOLUTION


def predicted_interleaving():
    """p = 4 ranks, m = 8 micro-batches, equal boxes: each v's idle share and messages per step (numbers only)."""
    ### BEGIN SOLUTION
    return {"bubble_v1": 3 / (8 + 3), "bubble_v2": 3 / (2 * 8 + 3), "bubble_v4": 3 / (4 * 8 + 3),
            "messages_v1": 2 * 8 * (4 - 1), "messages_v2": 2 * 8 * (8 - 1), "messages_v4": 2 * 8 * (16 - 1)}
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# Four `torchrun` ranks run your step with 2 chunks each (8 blocks, so one block per virtual stage, and 4
# micro-batches), then two ranks with 4 chunks each. The check compares the last rank's outputs and loss,
# and every rank's gradients, with the baseline (your Q4), and it checks that the pipeline is real and is
# Interleaved 1F1B: each rank built and ran only its chunks' blocks; every message goes to the rank that
# holds the next (or previous) virtual stage, the wrap-around included, as many per chunk as the schedule
# implies; no rank holds more chunk forwards than the warm-up allows; and the chunks are visited in the
# schedule's order. Below the result: each rank's chunks and the order it ran its boxes in, the measured
# schedule, and the bubble next to (p-1)/(v·m+p-1).

# %%
report = check("q15")

# %% [markdown]
# ## What your code did
#
# Your run on 4 ranks with 2 chunks: the boxes of chunk 1 are paler than those of chunk 0, and their
# labels say which chunk they belong to (`F3c1` is the forward of micro-batch 3 on chunk 1). Follow the
# arrows from rank 3 back to rank 0: those are the wrap-around messages. `report.timeline(1)` draws the
# run with 4 chunks on 2 ranks.

# %%
report.timeline()

# %% [markdown]
# ## The bubble for v = 1, 2 and 4
#
# The check's model is so small that a message costs as much as a block's compute, and then no schedule
# hides anything. The study below runs *your* step on 4 ranks of a model where compute dominates (16
# blocks of width 256), with 1, 2 and 4 chunks per rank and m = 8 micro-batches, and prints for each its
# bubble with emulated compute and measured, beside the theory, the messages sent, and the activations rank
# 0 held at its peak, and says why the measurement departs from the ideal. It takes under a minute on 2
# CPU cores. It is not graded: Validate skips it, and so does the grader.
#
# Which formula, and why: the lab measures the bubble as the idle share of the whole step, 1 - (time
# spent computing) / (p × step time), the same quantity for every schedule. For v chunks that share is
# (p-1)/(v·m+p-1); with v = 1 it is the (p-1)/(m+p-1) of Q8. The Megatron-LM paper writes (p-1)/(v·m)
# instead: the idle time divided by the *compute* time, which is not a share of anything (it exceeds 1 when
# m < p) and cannot be compared with a measured fraction.
#
# The columns: **emulated** replays your run, each rank's operations in the order it ran them and each
# receive waiting for its send, with every box the median length of its kind in this run and messages at
# a small fixed price: the bubble your order makes, whatever else the machine runs. **ideal** is the
# schedule's own order with the same costs; where your emulated bubble equals it, your step runs the
# schedule. **measured** is the wall clock: on a hub the 4 ranks share 2 cores, so a rank waiting for a
# core counts as busy, and each of the v-fold messages costs time on the rank that waits for it.
#
# What to look for: the emulated bubble falls with v as the theory does (27 %, 16 %, 9 % for v = 1, 2, 4,
# in every run: it depends on your step's order, not on the machine's load). The measured bubble does not,
# on 2 cores, and it moves from run to run: in six runs on a machine shared with other work (load average
# 7 to 18) it lay between 20 % and 43 % for all three v, and which v came out best changed from one run to
# the next (in earlier runs: 21–23 % on an idle machine). Your measured column is another draw from that
# spread; your emulated column should repeat 27 %, 16 % and 9 %. The messages grow with v (48, 112 and 240
# a step here), and rank 0 holds more activations at its peak than 1F1B would (the last column: p +
# (p-1)/v stages' worth against p). With v = 1 the same warm-up formula gives 2(p-r-1) forwards, more than
# 1F1B's p-r-1: that row is not 1F1B. That
# is the trade: interleaving buys a smaller bubble with more communication and more memory in flight.

# %%
from lab_src.checks.q15_interleaved_step import bubble_study

study = bubble_study()

# %% [markdown]
# Your run with v = 4, measured and, with the toggle, with emulated compute: the emulated view shows the
# short ramps that give interleaving its smaller bubble; the measured one, the same order stretched by the
# shared cores.

# %%
study.timeline(2) if study else None

# %% [markdown]
# ## The production API
#
# `torch.distributed.pipelining` ships this schedule as `ScheduleInterleaved1F1B`: one `PipelineStage` per
# chunk (its virtual stage's index), all of a rank's chunks handed to one schedule object. The next cell runs
# it on the chunks your answers build (the study's model, 2 chunks per rank) and draws its timeline under
# your step's, with each rank's order beside yours (under a minute; ungraded, skipped by Validate).

# %%
from lab_src.checks.torch_bridge import interleaved_bridge

bridge = interleaved_bridge(v=2)
bridge.figure() if bridge else None

# %% [markdown]
# ## Part 2 · Cutting the model by tracing it
#
# Q5 hands out *blocks* by index, and `PipelineStage` builds the named pieces. That works because this
# lab's model is a list of blocks. Many models are not: one `forward` with skip connections, layers used
# twice, several tensors flowing side by side. Libraries such as NeuronxDistributed and
# `torch.distributed.pipelining` instead cut the model where you tell them, by **tracing** it.
# `torch.fx.symbolic_trace` runs the model's `forward` once on stand-in values and writes down every
# operation as a node of a graph, each node tagged with the modules it ran in. Then naming the *cut points*
# is enough: `"blocks.3"` means "stage 1 begins where the forward enters `blocks.3`". Each node goes to the
# stage of the last cut point before it, and `torch.fx.passes.split_module` builds one module per stage; the
# values that cross a cut become the outputs of one stage and the inputs of the next.
# (`lab_src/topics/interleaved/traced.py` does this in about forty lines.)
#
# Set `CUT_POINTS`, in the cell below, to the cut points that give the same stages as your Q5 for 8 blocks
# on 3 stages. The cell after it traces the model, cuts it there, and compares each traced stage with the
# `PipelineStage` your Q5 builds: the pieces it holds, its parameters, and its output on the same input.
# This part is an experiment, not graded: the 20 points of Q15 are your `interleaved_step`.

# %% nbgrader={"grade": false, "grade_id": "q15_cut_points", "locked": false, "schema_version": 3, "solution": true, "task": false}
# Where stages 1 and 2 begin: module names such as "blocks.4"
### BEGIN SOLUTION
CUT_POINTS = ["blocks.3", "blocks.6"]
### END SOLUTION

# %%
from lab_src.checks.q15_interleaved_step import traced_partition, what_crosses

traced = traced_partition(CUT_POINTS, num_layers=8)

# %% [markdown]
# A cut does not have to fall between blocks. Cut inside block 2, between its MLP's `up` and `down`
# projections, and look at what would travel to the next stage:

# %%
what_crosses(["blocks.2.down", "blocks.5"]);

# %% [markdown]
# Two tensors cross the first cut: the residual stream `(2, 16, 32)`, which the block adds back after
# its MLP, and the MLP's hidden activation `(2, 16, 128)`, four times wider. Tracing found both; your Q7
# and Q8 send exactly one buffer of `activation_shape` per micro-batch and could not carry this cut.
#
# **What tracing buys.** Any model whose forward can be traced, not only a list of blocks; cuts anywhere,
# inside a block included; the tool works out which values cross each cut and builds every stage's module,
# so nobody writes a stage class per architecture.
#
# **What it costs.**
# - The forward must be traceable. Symbolic tracing follows one path through the Python code: a branch
#   on a tensor's *value* (`if x.sum() > 0`) cannot be traced, and Python loops are unrolled into the graph.
#   `torch.export`, which `torch.distributed.pipelining` uses, accepts more Python but specialises shapes,
#   so another batch shape can mean another trace.
# - Python that is not a tensor operation runs once, while tracing, and is not in the graph. The lab's model
#   counts its pieces' forward calls; the check above shows that the traced stages counted none.
# - Names change (`blocks.3.qkv.weight` becomes `blocks_3_qkv.weight` inside a stage), so checkpoints,
#   optimizer states and comparisons with the baseline need a map back; and the stage modules are generated
#   code, harder to read and to debug than a stage you wrote.
# - Tracing does not choose *good* cut points: a cut can send more, and larger, tensors than needed (as
#   above), and balancing the stages' compute is still your job.

# %% nbgrader={"grade": true, "grade_id": "q15_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q15 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q15")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q15")
### END HIDDEN TESTS
