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
# # Q19 · Data parallel from first principles: a ring all-reduce from point-to-point messages
#
# *Exercise q19 of the pipeline-parallelism lab · 20 points*
#
# Data parallelism gives every rank the whole model and a different slice of the batch. After the
# backward, each rank holds gradients of its own slice; before the optimizer step every rank needs their
# sum (or mean), so that all replicas take the same step. That sum is an **all-reduce**, and in q14 you
# called one. Here you write it.
#
# The algorithm nearly every library uses for large tensors is the **ring**: the n ranks of the group
# stand in a circle, each sends only to the next and receives only from the previous, and the tensor
# travels in n chunks. First a **reduce-scatter**: in n - 1 steps each rank passes a chunk on and adds the
# chunk that arrives to its own, until each rank holds one chunk of the finished sum. Then an
# **all-gather**: n - 1 more steps pass the finished chunks round until every rank holds all of them. The
# figure is that algorithm on 4 ranks, step by step.

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.topics.data_parallel.figure import ring_figure

ring_figure(n=4)

# %% [markdown]
# ## Predict first
#
# The lab's seed course trains an MNIST MLP, 784 → 256 → 128 → 64 → 10, in float32, and all-reduces each
# layer's gradient (weights and bias) after the backward: 803,840 bytes for `fc1`, 131,584 for `fc2`,
# 33,024 for `fc3` and 2,600 for `fc4`. **On a ring of 4 ranks, how many bytes does each rank send, on
# average, to sum each layer's gradient?** How does that compare with passing the whole gradient round the
# ring (each rank forwarding the running sum n - 1 times), and what happens to your answer as n grows?
#
# Write your four numbers in `predicted_bytes()` in the answer cell below, before you write the ring, as
#
#     return {"fc1": ..., "fc2": ..., "fc3": ..., "fc4": ...}
#
# each the bytes one rank sends on average for that layer: numbers, or arithmetic on numbers such as
# `3 * 1024`. They are graded: right within half a percent. The check runs your ring on exactly these four
# sizes and prints each of your numbers as right or wrong, beside what it measured.
#
# <details><summary><b>Hint</b>: counting (open it if you are stuck)</summary>
#
# Count the chunks, not the ranks: in each of the two halves, how many times does each of the n chunks
# cross a link? Divide by n for the average rank. Uneven chunks (2,600 bytes is 650 elements, not a
# multiple of 4) change what one rank sends, not the average.
# </details>

# %% [markdown]
# ## Your task
#
# Write `ring_all_reduce(tensor, group=None)`: sum `tensor` over the ranks of `group` **in place**, with a
# ring, and return it. Every rank of the group calls it with a tensor of the same shape and dtype;
# afterwards each holds the sum, and all hold **exactly the same bits**.
#
# - Only point-to-point messages: `dist.send`, `dist.recv`, `dist.isend`, `dist.irecv`,
#   `dist.batch_isend_irecv`. A collective of `torch.distributed` fails the check.
# - Each message goes to the next position of the ring or comes from the previous one. Positions are ranks
#   *of the group*: `dist.get_rank(group)`, `dist.get_world_size(group)`, and `group_dst=` / `group_src=`
#   (or `dist.get_global_rank(group, position)` for `dst=` / `src=`). The check also runs your ring on the
#   two data-parallel columns of a 2 × 2 grid, the groups of ranks [0, 2] and [1, 3], where global rank
#   + 1 is not your neighbour.
# - Any length works, fewer elements than ranks included. A group of one rank returns at once.
# - At most 2(n - 1) messages from each rank, none larger than a chunk (ceil(length / n) elements).
#
# The whole contract: `help(lab_src.exercises.ring_all_reduce)`. The grader runs n = 2, 3 and 4, the
# columns of a grid, float32 and float64, lengths from 1 to 4,194,305 elements (16 MiB), and compares every
# rank's result with the inputs' sum, the ranks' bits with each other, and every message your code made
# (recorded by the lab: peer, bytes) with a ring's.
#
# <details><summary><b>Hint</b>: the chunks (open it if you are stuck)</summary>
#
# `torch.tensor_split(tensor.view(-1), n)` gives n views into the tensor (some empty when it is short);
# adding into a view, or copying into it, changes the tensor itself. Write down, for rank r and step s,
# which chunk it sends and which it receives; the figure above is the answer for n = 4.
# </details>
#
# <details><summary><b>Hint</b>: why it hangs (open it if you are stuck)</summary>
#
# Every rank sends at the same moment. A blocking `dist.send` waits until its receive is posted, and your
# neighbour posts that receive only after its own send returns. Post the send and the receive of a step
# together (`dist.batch_isend_irecv` with two `dist.P2POp`s, or `isend`, then the receive, then `wait`).
# </details>

# %% nbgrader={"grade": false, "grade_id": "q19_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q19
import torch
import torch.distributed as dist


def predicted_bytes():
    """The bytes each rank of a ring of 4 ranks sends, on average, to sum each layer's gradient (float32)."""
    # return {"fc1": ..., "fc2": ..., "fc3": ..., "fc4": ...} with a number for each
    ### BEGIN SOLUTION
    # 2(n - 1)/n of each layer's bytes, n = 4: every chunk is sent n - 1 times in each half
    return {"fc1": 1_205_760, "fc2": 197_376, "fc3": 49_536, "fc4": 3_900}
    ### END SOLUTION


def ring_all_reduce(tensor, group=None):
    ### BEGIN SOLUTION
    n = dist.get_world_size(group)
    if n == 1:
        return tensor
    me = dist.get_rank(group)
    right, left = (me + 1) % n, (me - 1) % n
    chunks = list(torch.tensor_split(tensor.view(-1), n))    # n views, some empty when short

    def exchange(send, recv):
        """Send one chunk to the right while receiving one from the left, posted together."""
        ops = [dist.P2POp(dist.isend, send, group=group, group_peer=right),
               dist.P2POp(dist.irecv, recv, group=group, group_peer=left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    # reduce-scatter: after step s, chunk (me - s - 1) holds s + 2 ranks' parts; at the end, chunk me + 1 is whole
    for step in range(n - 1):
        mine = chunks[(me - step - 1) % n]
        received = torch.empty_like(mine)
        exchange(chunks[(me - step) % n], received)
        mine += received
    # all-gather: pass the finished chunks round, each as it is
    for step in range(n - 1):
        received = torch.empty_like(chunks[(me - step) % n])
        exchange(chunks[(me + 1 - step) % n], received)
        chunks[(me - step) % n].copy_(received)
    return tensor
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# The check runs your ring on 4 ranks (real processes, gloo on the CPU) over the gradients' sizes of the
# seed's four layers and a few short tensors, then on the two columns of a 2 × 2 grid. It prints, for each
# length, the bytes each rank sent beside a ring's 2(n - 1)/n, the messages, the largest message and the
# time, then each number of your prediction, right or wrong, beside the measurement.

# %%
report = check("q19")

# %% [markdown]
# ## What your code did
#
# Every message of every rank, on a measured time axis (press play, or move the slider, to go through it
# event by event): one bar per send or receive, from its posting to the end of its wait. Above the ranks,
# each call of your ring, named by its tensor's length in elements (the seed's layers: "fc1: 200,960").
# An arrow to a lower rank (orange) is the ring's wrap-around, from the last rank to the first. Find the
# 2(n - 1) ring steps of the largest length (in each, every rank sends one chunk and receives one). Which
# ring step waits longest, and for whom?

# %%
report.timeline()

# %% [markdown]
# ## Latency and bandwidth
#
# A ring's time has two parts: each of its 2(n - 1) ring steps pays a fixed cost α (the latency: posting,
# matching, waking the receiver), and each moves a chunk of S / n bytes at β seconds per byte:
#
#     T(S) = 2(n - 1) α + 2(n - 1)/n · S · β
#
# Short tensors are latency-bound, long ones bandwidth-bound. The study below times your ring and gloo's
# own all-reduce on 4 ranks of this machine at lengths from 1 element to 4,194,304 (16 MiB), five times
# each (about 10 s), and prints, as nccl-tests does, the **algbw** (bytes / time) and the **busbw** (algbw
# × 2(n - 1)/n: what each rank's link carried, the number to compare with a link's bandwidth). The four
# ranks share this machine's cores and talk over loopback, and the lab records every message: the times are
# this machine's and the lab's, not a cluster's. Fit α and β to your ring's times (a least-squares fit of
# the two-term model, or two points: the shortest length for α, the longest for β), then draw your model
# over the measurements. Where is the length at which the two terms are equal? Is gloo's all-reduce
# faster on the long tensors, and by how much of the busbw? The study prints the times, not the fit: the
# fit is yours. Once you set your α and β, the figure draws your model beside the lab's own fit. Most of
# this machine's α is not a wire: it is processes waking up on shared cores and the lab's bookkeeping of
# every message (each one journalled for the deadlock watch, and waited for in a wait the check can stop),
# which gloo's own all-reduce, measured through the same recorder but with fewer, larger steps, pays less
# often.
#
# <details><summary><b>Hint</b>: the fit (open it if you are stuck)</summary>
#
# `study.ring` maps each length to its median time in seconds, `study.nbytes(length)` gives its bytes and
# `study.n` the ranks. The model is linear in α and β: one row `[2(n - 1), 2(n - 1)/n · S]` per length,
# and `numpy.linalg.lstsq` solves for both at once (divide each row and its time by the time, so that the
# short lengths count as much as the long ones).
# </details>

# %%
from lab_src.checks.ring_study import ring_study

study = ring_study()

# %%
alpha, beta = None, None      # your fit: seconds per step, seconds per byte
study.figure(alpha, beta) if study else None

# %% [markdown]
# ## A network with a latency tail (emulated)
#
# On a cluster your ring's messages cross a network, and networks have tails: most messages of a size take
# about the same time, a few take far longer. The seed's measurement of a pipelined MLP on an emulated fabric
# found each layer's collective taking 20 ms and more, and in some runs a tail of several seconds. This machine has no network between
# its ranks, so the lab **emulates** one under your ring: each message you send is held back for
# `latency + bytes / bandwidth` before it leaves (a sleep in a thread of the sending rank: it uses no CPU), and
# a share q of the messages, drawn at random but the same in every run, is held 100 times as long. Each link
# delivers in order, so a message queued behind a slow one waits for it too.
#
# The study runs 200 data-parallel steps on 4 ranks (about 20 s on an idle 2-core machine; on one shared with
# other work, 35 to 50 s in five runs and two minutes in a sixth). In each, your ring all-reduces the seed's
# four layers' gradients one after another, last layer first (fc4, fc3, fc2, fc1), as a backward finishes
# them; it times each layer's all-reduce and the whole step on every rank, and keeps the slowest rank's (a
# step ends when every rank has its gradients). The emulated network: latency 1 ms, 125 MB/s (1 Gbit/s),
# q = 0.2 % of messages 100 times slower.
#
# **Predict before you run it**, and write your numbers into `predicted` (ms):
# 1. How many messages k does one step send, all links together? What share of the steps should meet at
#    least one slow message, 1 − (1 − q)^k? Is it more or less than half? More or less than 1 %?
# 2. The median step (`p50`): the network's part, plus this machine's own part from your α above. The
#    network's part is emulated and the same in every run; this machine's part is not: your α was measured
#    a minute earlier, under whatever load the machine had then, and each step pays the load of its own
#    run. On a 2-core machine shared with other work, six runs (load average 10 to 29) gave medians up to
#    twice one another and 99th percentiles up to three and a half times one another; this recipe overshot
#    one run's median by 40 % and met another's within 3 %. Count your p50 as close if it is within a
#    factor of two, and look at `uptime` before you compare.
# 3. The 99th percentile (`p99`): does the 99th-percentile step meet a slow message? How much does one add?
#
# Then compare: which layer meets the slowest slow messages, and why that one? Open the slowest step's
# timeline: would you find the straggler in each rank's time alone, or only in the waits of its messages?
#
# <details><summary><b>Hint</b>: the network's part of a step</summary>
#
# Each layer is one all-reduce of 2(n − 1) ring steps that follow one another; each step is one message of
# a chunk, S / n bytes (S: the layer's gradient bytes, from your `predicted_bytes` above), so it costs
# `latency + (S / n) / bandwidth`. A slow message costs 100 times its own delay instead, and the whole ring
# waits for it: every later step needs the chunk it carries.
# </details>

# %%
from lab_src.checks.network_study import network_study

predicted = {"p50": None, "p99": None}      # your prediction of one step's time, in ms, before you run it
net_study = network_study(predicted=predicted)

# %%
net_study.figure(predicted) if net_study else None

# %%
net_study.timeline() if net_study else None     # the slowest step (or .timeline(step)); a slow message outlined in red

# %% nbgrader={"grade": true, "grade_id": "q19_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q19 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q19")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q19")
### END HIDDEN TESTS
