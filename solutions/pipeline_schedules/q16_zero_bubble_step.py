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
# # Q16 · Zero bubble: split the backward, fill the bubble
#
# *Exercise q16 of the pipeline-parallelism lab · 20 points, and 4 graded by hand*
#
# Your 1F1B step (Q12) keeps memory bounded, but its bubble is AFAB's: (p−1)/(m+p−1) of the step. Since
# 2024, large-model training fills most of it (Qi et al., *Zero Bubble Pipeline Parallelism*, 2024;
# `torch.distributed.pipelining` ships it as `ScheduleInterleavedZeroBubble` and `ScheduleZBVZeroBubble`).
# The idea: **a backward is two computations.** The gradient with respect to the stage's *input* (call it
# I, torch's "backward input") is what the previous stage waits for. The gradients of the stage's
# *weights* (W) are needed by nobody until the optimizer step. So send the input's gradient as soon as I
# is done, and run W later, in the time the rank would otherwise sit idle. Drawn from the lab's schedule
# model (4 stages, 8 micro-batches, a backward twice a forward, I and W half of it each):

# %%
# %load_ext lab_src
from lab_src.checks import check
from lab_src.views.schedule_figure import schedule_figure

schedule_figure(("1f1b", "zbh1"), p=4, m=8, bubbles=False)

# %% [markdown]
# **Predict, then run.** Before you read on: with p = 4, m = 8 and every F, I and W box the same length,
# what share of the step is idle in 1F1B (a backward is I + W, two boxes), and in the ZB-H1 picture above?
# Write your two numbers (arithmetic is fine) in the cell below; the study at the end of the notebook
# prints them beside what your steps do, and the schedule model's answer. Not graded.

# %%
PREDICTED_BUBBLE = {"1f1b": None, "zbh1": None}    # your two idle shares, e.g. 1 / 2

# %% [markdown]
# **ZB-H1** (torch's ZB1P with one stage per rank) is 1F1B's order with each backward replaced by its I,
# plus the W's:
#
# - rank r runs 1F1B's warm-up, min(p − r − 1, m) forwards, then one forward and one I in turn, then the
#   remaining I's;
# - **the gradient I computed goes to the previous stage at once**, before the rank computes anything else;
# - rank r runs the W of its k-th backward right after its (k + r)-th I, and its last r W's at the end of
#   the step: the last rank delays its W's the most, the first not at all. Follow rank 0 at the end of
#   the picture: it would wait for gradients, and the other ranks' W's are no longer in their way.
# - A micro-batch is held from its forward until its W (W still needs what the forward saved), and no rank
#   holds more than min(p, m): the first stage's bound in 1F1B, so the peak memory stays 1F1B's.
#
# With equal times the bubble falls from (p−1)·3 boxes to (p−1)·1: (p−1)(T_F + T_B − T_W) instead of
# (p−1)(T_F + T_B + T_W), where T_B is now I's time (the paper's Table 2).

# %% [markdown]
# **How this notebook works.** Run the cells from top to bottom. The cell that starts with `%%answer q16`
# is yours: running it defines your functions here *and* saves them to `answers/q16_zero_bubble_step.py`.
# The check below it starts real `torchrun` processes, and each of them loads that file, so always re-run
# your answer cell after editing it. Keep the answer cell self-contained (its own imports and helpers).
#
# ## Your task
#
# Three functions, in the one answer cell:
#
# **1. `backward_input(stage, input_tensor, output_tensor, output_grad)`**, returning `(input_grad, kept)`:
# the gradient of `input_tensor` only (None on the first stage, whose input is token ids; on the last stage
# `output_tensor` is the loss and `output_grad` is None), and `kept`, whatever your W will need. It must
# leave every `.grad` of the stage's weights untouched.
#
# **2. `backward_weight(stage, kept)`**: the weights' gradients, *added* into each parameter's `.grad`
# exactly as `backward()` would add them (an earlier micro-batch's gradient is already there).
#
# The stage calls them for you: `stage.backward_input(x, y, grad, microbatch=mb)` runs yours, records an I
# box and returns `input_grad`; `stage.backward_weight(microbatch=mb)` runs yours on what your I kept for
# that micro-batch, records a W box and lets go of `kept`.
#
# What is graded about the split, on each stage of a float64 model, one micro-batch at a time:
# - I's input gradient and I + W's weight gradients equal one `backward()`'s to 1e-12;
# - **nothing computed twice**: I and W together do the floating-point work of one backward (within 5 %,
#   counted with `torch.utils.flop_counter.FlopCounterMode`);
# - **memory freed**: once W has run, autograd holds nothing more for that micro-batch.
#
# Write it the first way first: I with `torch.autograd.grad(..., inputs=...)`, W as a second pass from the
# output to the weights. Check it (the check prints each stage's operations against one backward), and
# see what the second pass costs. Then make W start where the work for the weights begins.
#
# **3. `zero_bubble_step(stage, data_iter, num_microbatches)`**: one ZB-H1 step, with `stage.forward`,
# your two halves through the stage, and `stage.send`/`stage.recv` (as in Q15: `stage.recv(src,
# stage.activation_shape, "recv_forward", mb)`, `stage.send(tensor, dst, "send_backward", mb)`; received
# activations need `requires_grad_()`). Loss, scaling and return value as in Q8.
#
# <details><summary>Hint: what autograd does when you ask for the input's gradient only</summary>
#
# `torch.autograd.grad(output, input_tensor, grad, retain_graph=True)` runs only the nodes on the path from
# the output to the input, and each of them computes only the gradients that path needs: a linear layer's
# node computes the gradient of its input, not of its weight. Without `retain_graph=True` autograd frees
# what the forward saved as it goes, and W finds nothing left. A second `torch.autograd.grad(output,
# weights, grad)` goes down the same path again to reach each weight: the input's path is computed twice.
# </details>
#
# <details><summary>Hint: where W can start</summary>
#
# Walk the graph from `output_tensor.grad_fn` through `node.next_functions`. The weights hang off the
# input's path: at some nodes (a linear layer's, a layer norm's) one edge continues towards the input and
# another leads to a weight's `AccumulateGrad` (what `p.view_as(p).grad_fn.next_functions[0][0]` is, for a
# parameter `p`). During I, `node.register_prehook(fn)` hands you the gradient arriving at each of those
# nodes; keep it. W then runs `torch.autograd.grad` from `torch.autograd.graph.GradientEdge(node, i)`
# with those gradients, to the weights below that node. `torch/distributed/pipelining/_backward.py`
# (`stage_backward_input`, `stage_backward_weight`) is torch's version of this design: read it, then
# write your own.
# </details>
#
# <details><summary>Hint: the step</summary>
#
# Keep the list of micro-batches whose I has run, in order. After the k-th I (counting from 0) of rank r,
# if k ≥ r run the W of the (k − r)-th; after the last I run the W's still missing. Send each I's gradient
# before that W.
# </details>

# %% nbgrader={"grade": false, "grade_id": "q16_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
# %%answer q16
import torch
from torch.autograd.graph import GradientEdge


def backward_input(stage, input_tensor, output_tensor, output_grad):
    """I: the gradient of the stage's input only. Returns (input_grad, kept): kept is what W needs."""
    ### BEGIN SOLUTION
    def node_of(t):      # the node that receives t's gradient: its grad_fn, or a leaf's gradient accumulator
        return t.grad_fn if t.grad_fn is not None else t.view_as(t).grad_fn.next_functions[0][0]

    def below(root):     # every node reachable from root
        seen, todo = {}, [root]
        while todo:
            node = todo.pop()
            if node is not None and node not in seen:
                seen[node] = True
                todo += [f for f, _ in node.next_functions]
        return list(seen)

    def reaching(nodes, targets):   # the nodes from which one of `targets` can be reached
        parents = {}
        for node in nodes:
            for f, _ in node.next_functions:
                if f is not None:
                    parents.setdefault(f, []).append(node)
        found, todo = set(), [t for t in targets if t in parents]
        while todo:
            node = todo.pop()
            if node not in found:
                found.add(node)
                todo += parents.get(node, [])
        return found

    grad = torch.ones_like(output_tensor) if output_grad is None else output_grad
    params = [p for p in stage.parameters() if p.requires_grad]
    if input_tensor is None or not input_tensor.is_floating_point():
        return None, ("whole", output_tensor, grad, params)     # first stage: tokens in, W does all the work
    target = node_of(input_tensor)
    weights = {node_of(p): p for p in params}
    nodes = below(output_tensor.grad_fn)
    to_input, to_weight = reaching(nodes, {target}), reaching(nodes, set(weights))
    # where the path from the output to the input branches off towards weights: the gradients arriving
    # at those nodes are all that W needs, so W starts there and never redoes the input's path
    branches = {}
    for node in nodes:
        off = [f for f, _ in node.next_functions if f is not None and f not in to_input and f in to_weight]
        if node in to_input and off:
            branches[node] = list({id(w): w for f in off for n in below(f) if n in weights
                                   for w in [weights[n]]}.values())
    caught = {}
    handles = [node.register_prehook(lambda g, node=node: caught.__setitem__(node, g)) for node in branches]
    try:
        (input_grad,) = torch.autograd.grad(output_tensor, input_tensor, grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return input_grad, ("branches", [(node, caught[node], ws) for node, ws in branches.items() if node in caught])
    ### END SOLUTION


def backward_weight(stage, kept):
    """W: the weights' gradients from what backward_input kept, accumulated into .grad."""
    ### BEGIN SOLUTION
    def accumulate(params, grads):
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    how, *rest = kept
    if how == "whole":
        output_tensor, grad, params = rest
        accumulate(params, torch.autograd.grad(output_tensor, params, grad, allow_unused=True))
        return
    for node, grads, ws in rest[0]:
        edges = [(GradientEdge(node, i), g) for i, g in enumerate(grads) if g is not None]
        accumulate(ws, torch.autograd.grad([e for e, _ in edges], ws, [g for _, g in edges], allow_unused=True))
    ### END SOLUTION


def zero_bubble_step(stage, data_iter, num_microbatches):
    """One ZB-H1 step of this stage; returns (outputs, loss)."""
    ### BEGIN SOLUTION
    m, p, r = num_microbatches, stage.pp_size, stage.pp_rank
    warmup = min(p - r - 1, m)
    shape = stage.activation_shape
    inputs, outputs, logits, losses, done = {}, {}, [], [], []

    def forward(mb):
        if stage.is_first_stage:
            x = next(data_iter).to(stage.device)
        else:
            x = stage.recv(r - 1, shape, "recv_forward", mb).requires_grad_()
        y = stage.forward(x, microbatch=mb)
        inputs[mb] = x
        if stage.is_last_stage:
            logits.append(y.detach())
            outputs[mb] = y.mean() / m
            losses.append(float(outputs[mb].detach()))
        else:
            outputs[mb] = y
            stage.send(y, r + 1, "send_forward", mb)

    def backward(mb):
        grad = None if stage.is_last_stage else stage.recv(r + 1, shape, "recv_backward", mb)
        input_grad = stage.backward_input(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)
        if not stage.is_first_stage:
            stage.send(input_grad, r - 1, "send_backward", mb)      # the previous stage waits for it: now
        done.append(mb)
        if len(done) > r:                        # rank r runs its W's r backwards late
            stage.backward_weight(microbatch=done[len(done) - 1 - r])

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
    for mb in done[max(0, len(done) - r):]:      # the W's left: where 1F1B would wait
        stage.backward_weight(microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(losses)
    return [], None
    ### END SOLUTION


# %% [markdown]
# ## Check
#
# First your two halves alone, on one rank: every stage of a 3-stage float64 model (the first, whose input
# is tokens; a middle one; the last, whose output is its loss) against one `backward()`. Then four
# `torchrun` ranks run your step with 4 micro-batches, and three ranks with 7 uneven blocks and 2. The check
# compares outputs, loss and gradients with the baseline (your Q4), checks the pipeline is real, and
# reads ZB-H1's rules from what each rank recorded: every W after its I, each gradient sent before the
# rank computes anything else, at most min(p, m) micro-batches held from forward to W, 1F1B's order of
# forwards and I's, and where the W's go (rank r's W of backward k right after its I of backward k + r).
# The time grid marks I boxes `i` and W boxes `w`.

# %%
report = check("q16")

# %% [markdown]
# ## What your code did
#
# Your 4-stage run: I boxes in dark orange, W boxes in gold, and the memory each rank holds under the
# ranks. On this small model a message costs about a layer's compute, so the bubble is not the picture's;
# the study below measures it where compute dominates.

# %%
report.timeline()

# %% [markdown]
# ## The bubble, measured: 1F1B against ZB-H1
#
# Your Q12 step and your ZB-H1 step on 4 ranks of a model where compute dominates (8 blocks of width 256),
# for m = 4, 8 and 16, in under a minute on 2 CPU cores; it is not graded, and Validate and the grader
# skip it. For each m it prints three pairs of bubbles and the peak activation memory of both steps:
#
# - **emulated compute**: each run replayed, each rank's operations in the order your step ran them and
#   each receive waiting for its send, with every F, I and W box the median of its kind in your ZB-H1 run
#   (a 1F1B backward is one I and one W) and every message a small fixed price: the bubble your two
#   schedules make, whatever else the machine runs;
# - **schedule model**: the schedules themselves with the same box lengths; where your emulated bubbles
#   equal these, your steps run the schedules' order;
# - **measured**: the wall clock of the same runs. On a hub the 4 ranks share 2 cores: a rank that waits
#   for a core counts as busy, and a box that waited for one is longer.
#
# What to look for: with emulated compute, ZB-H1's bubble below 1F1B's at every m, and the two peaks close
# (32.1 and 34.1 MiB). The emulated 1F1B column is the formula's in every run (43 %, 27 %, 16 %); ZB-H1's
# depends on the lengths of your three boxes, T_F, T_I and T_W, which this run measured and which move with
# the machine's load (T_I and T_W swap places from one run to the next). In six runs on a 2-core machine
# shared with other work (load average 6 to 18), at m = 8 it came out between 10.2 % and 12.5 % against
# 27.4 % (12.0 % and 14.6 % in two earlier runs: 0.37 to 0.53 times 1F1B's), at m = 16 between 4.9 % and
# 5.9 % against 16 %, and at m = 4 between 15 % and 31 % against 43 %: your run is another draw (the line
# under the table gives the model's bubbles with three equal boxes, beside your prediction). The schedule
# model's column, with your run's boxes, stays within half a point of the emulated one in every run: that,
# not the size of the gap, says your step runs ZB-H1's order. The measured bubbles on 2 cores keep less of the gap,
# sometimes none, and move from run to run: at m = 16, 1F1B 33–43 % and ZB-H1 21–32 % in those six runs;
# at m = 8, ZB-H1 measured above 1F1B in two of them (41 % against 32 %, 35 % against 26 %). The paper measured one GPU per stage
# (p = 8, m = 24: 1F1B 0.243, ZB-H1 0.159).

# %%
from lab_src.checks.zero_bubble_study import ideal_bubbles, zero_bubble_study

study = zero_bubble_study()
print("p = 4, m = 8, equal boxes: you predicted", PREDICTED_BUBBLE, "; the schedule model:", ideal_bubbles(4, 8))

# %% [markdown]
# Your ZB-H1 run with m = 8, measured and, with the toggle, with emulated compute: in the emulated view
# the W boxes (gold) fill the end of the step on the last ranks, where 1F1B leaves them idle; in the
# measured one the same order, stretched wherever a rank waited for a core.

# %%
study.timeline(3) if study else None

# %% [markdown]
# ## Written question (graded by hand)
#
# 1. Why are the first stage's W's not delayed at all, and the last stage's delayed the most? Say it in
#    terms of who waits for what at the start and at the end of the step.
# 2. What stops ZB-H1 from reaching a zero bubble, and what does ZB-H2 pay to get there?

# %% [markdown] nbgrader={"grade": true, "grade_id": "q16_why", "locked": false, "points": 4, "schema_version": 3, "solution": true, "task": false}
# 1. Nobody waits for a W, but everybody upstream waits for an I: at the end of the step the last
#    gradient crosses the stages from the last to the first, and each rank that runs a W before passing
#    an I on delays all the ranks before it. The last rank starts the backward chain and has the most
#    ranks waiting behind it, so it moves the most W's out of the way (r of them on rank r); the first
#    stage has nobody behind it, and its W's fill its own wait at the end. (2 points)
# 2. The warm-up: rank r still waits r forwards before its first box, and the last micro-batch's I's
#    still cross p − 1 stages with only (p−1)·T_W of W's to fill the wait: (p−1)(T_F+T_B−T_W) stays idle
#    (and more when T_W is small, or when messages cost). ZB-H2 starts more forwards in the warm-up
#    to fill the start as well, holding up to 2p − 1 micro-batches on a rank instead of p: about twice
#    1F1B's peak activation memory. (2 points)

# %% nbgrader={"grade": true, "grade_id": "q16_hidden", "locked": true, "points": 20, "schema_version": 3, "solution": false, "task": false}
# Hidden tests of q16 (20 points): the grader runs them in fresh processes, outside
# this notebook, and writes the score into the gradebook.
# Validate fails here unless the check above passed.
from lab_src.grading import require_check
require_check("q16")
### BEGIN HIDDEN TESTS
from lab_src.grading import scored_out_of_process
scored_out_of_process("q16")
### END HIDDEN TESTS
