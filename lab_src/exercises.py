"""The exercise API: one function per exercise, with its contract (signature and docstring).

The bodies here are never run. Calling `lab_src.distribute_layers(...)` finds the answer to q05 (the
student's, or the reference when the grader says so, see `answers.py`) and calls it; with no answer
it raises `NotImplementedError` naming the notebook to finish. Everything else in lab_src, and the
students' own later answers, call exercises only through these names, so each exercise can be swapped
independently.
"""
from __future__ import annotations

import contextlib
import functools

from lab_src import answers
from lab_src.registry import CODED, exercise

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without importing typing (type checkers and linters read the name)
if TYPE_CHECKING:
    # What the contracts' annotations name. The annotations are never evaluated (`from __future__ import
    # annotations`), so nothing is imported for them when the lab runs; the lab's classes are named through the
    # package (`lab_src.PipelineStage`, `lab_src.topics.dp_pp.grid.Grid`), not imported from their modules, most
    # of which import this one.
    from collections.abc import Callable, Iterable, Iterator
    from types import SimpleNamespace

    import torch
    from torch import nn

    import lab_src

_caller: list[str] = []
_checked: set[int] = set()
API: dict = {}    # qid -> the dispatching function, for every exercise with code (filled below)
# qid -> a context manager factory run around every call of that exercise, given the call's arguments
# (the checks' processes record q11's raw torch.distributed messages with it: comm/messages.py)
AROUND: dict = {}


@contextlib.contextmanager
def running_for(qid: str):
    """Name the exercise on whose behalf code runs, for the message of a missing earlier answer."""
    _caller.append(qid)
    try:
        yield
    finally:
        _caller.pop()


def _exercise_api(qid: str):
    def wrap(contract):
        ex = exercise(qid)

        @functools.wraps(contract)
        def dispatch(*args, **kwargs):
            fn = answers.load(qid)
            caller = _caller[-1] if _caller else None
            if fn is None:
                raise answers.StubCalled(answers.stub_message(qid, caller))
            if id(fn) not in _checked:
                answers.check_signature(qid, fn, contract)
                _checked.add(id(fn))
            try:
                if qid in AROUND:
                    with AROUND[qid](*args, **kwargs):
                        return fn(*args, **kwargs)
                return fn(*args, **kwargs)
            except NotImplementedError as e:
                if str(e):
                    raise
                raise answers.StubCalled(
                    f"{ex.id} {ex.function}() is still the stub from the release "
                    f"(raise NotImplementedError()): replace it with your code in {ex.notebook}"
                    + (f" before running the {caller} check" if caller and caller != qid else "")) from None

        dispatch.exercise = ex
        dispatch.contract = contract
        if contract.__name__ != ex.function:
            raise RuntimeError(f"the contract of {ex.id} is named {contract.__name__}, the registry says {ex.function}")
        API[ex.id] = dispatch
        return dispatch
    return wrap


@_exercise_api("q02")
def check_args(num_layers: int, num_stages: int, global_batch_size: int, num_microbatches: int,
               allow_uneven_layers: bool = False) -> int:
    """Validate a pipeline configuration and return the micro-batch size.

    Raise ValueError (not assert: `python -O` strips asserts) with a message that names the problem when
    - `num_stages` or `num_microbatches` is smaller than 1;
    - the layers do not divide evenly into the stages (unless `allow_uneven_layers`; even then every
      stage needs at least one layer);
    - the global batch does not divide evenly into `num_microbatches` micro-batches.
    Otherwise return `global_batch_size // num_microbatches`.
    """


@_exercise_api("q03")
def activation_shape(cfg: lab_src.LabConfig, micro_batch_size: int) -> tuple[int, ...]:
    """The shape of the tensor one stage sends to the next for one micro-batch, as a tuple of ints.

    `cfg` is a `LabConfig` (num_layers, hidden_size, num_heads, seq_len, vocab_size, ...). The receiving
    stage allocates a buffer of exactly this shape before the data arrives; gradients travel back
    with the same shape.
    """


@_exercise_api("q04")
def baseline_step(model: nn.Module, dataloader: Iterable[torch.Tensor],
                  device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward and backward pass of the whole (unsharded) model on one batch.

    Fetch the first batch from `dataloader`, move it to `device`, run `model` on it, use the mean of
    the output as the (fake) loss and run backward. Return `(output, loss)`.
    """


@_exercise_api("q05")
def distribute_layers(num_layers: int, pp_rank: int, pp_size: int) -> list[int]:
    """The indices of the transformer blocks that stage `pp_rank` of `pp_size` owns, in order.

    Consecutive stages own consecutive blocks; together they own every block exactly once. When the
    blocks do not divide evenly, the earlier stages take one extra block each.
    """


@_exercise_api("q06")
def needs_dataloader(pp_rank: int, pp_size: int) -> bool:
    """True when stage `pp_rank` of `pp_size` must read batches from the training dataloader."""


@_exercise_api("q07")
def pipeline_communicate(operation: str, stage: lab_src.PipelineStage, tensor: torch.Tensor | None = None,
                         microbatch: int = 0) -> torch.Tensor | None:
    """Carry out one point-to-point operation of `stage`, or nothing where the operation does not apply.

    `operation` is one of "recv_forward", "send_forward", "recv_backward", "send_backward". Use
    `stage.send(tensor, dst=..., operation=..., microbatch=...)` and
    `stage.recv(src=..., shape=..., operation=..., microbatch=...)`; peers are pipeline ranks.
    Return the received tensor for a receive, and None for a send or when there is nothing to do.
    """


@_exercise_api("q08")
def afab_step(stage: lab_src.PipelineStage, data_iter: Iterator[torch.Tensor] | None,
              num_microbatches: int) -> tuple[list[torch.Tensor], float | None]:
    """One All-Forward-All-Backward training step of `stage` over `num_microbatches` micro-batches.

    `data_iter` yields micro-batches of tokens on the stages that need the dataloader (None elsewhere).
    Use `pipeline_communicate`, `stage.forward` and `stage.backward`. The loss of a micro-batch is
    the mean of the last stage's output, scaled so that the gradients equal the full-batch baseline's.
    Return `(outputs, loss)`: on the last stage the list of each micro-batch's output (detached) and
    the total loss as a float; on other stages `([], None)`.
    """


@_exercise_api("q09")
def check_outputs(outputs: list[torch.Tensor], baseline_output: torch.Tensor, stage: lab_src.PipelineStage) -> bool:
    """Compare the pipelined outputs with the baseline's on the stage that holds them.

    `outputs` is what `afab_step` returned on this stage; `baseline_output` is the unsharded model's
    output for the whole batch. Return True after a successful comparison, False on a stage that has
    nothing to compare; raise AssertionError (torch.testing.assert_close) when they differ.
    """


@_exercise_api("q10")
def check_gradients(stage: lab_src.PipelineStage, baseline_grads: dict[str, torch.Tensor]) -> list[str]:
    """Compare the gradient of every parameter this stage owns with the baseline's.

    `baseline_grads` maps full-model parameter names (e.g. "blocks.5.up.weight") to gradients.
    Raise AssertionError when a gradient differs or is missing; return the names checked.
    """


@_exercise_api("q11")
def p2p_communicate(operation: str, stage: lab_src.PipelineStage, tensor: torch.Tensor | None = None,
                    microbatch: int = 0, recv_microbatch: int | None = None) -> torch.Tensor | None:
    """One point-to-point operation of `stage` with raw torch.distributed calls, or nothing where it
    does not apply.

    `operation` is one of the four single operations of q07 ("recv_forward", "send_forward",
    "recv_backward", "send_backward") or one of the two combined operations of a 1F1B steady state:
    "send_forward_recv_backward" (send `tensor`, this stage's output, to the next stage and receive the
    gradient of an earlier output from it) and "send_backward_recv_forward" (send `tensor`, the gradient
    of this stage's input, to the previous stage and receive the next activation from it).

    Allocate each receive buffer yourself: `stage.activation_shape`, `stage.dtype`, `stage.device`, and
    `requires_grad=True` for a received activation (this stage's backward needs its gradient). Build
    `dist.P2POp`s on `stage.group` with the peer's pipeline rank (`group_peer=`), post them with
    `dist.batch_isend_irecv`, and wait for every request before returning.
    Return the received tensor (for a combined operation, the one it received), else None; at the ends
    of the pipeline, where an operation has no peer, do nothing and return None. `microbatch` is the
    micro-batch of the tensor sent (or received, for a single receive), `recv_microbatch` that of the
    tensor a combined operation receives (default: `microbatch`); the checks label the messages with
    them.
    """


@_exercise_api("q12")
def one_f_one_b_step(stage: lab_src.PipelineStage, data_iter: Iterator[torch.Tensor] | None,
                     num_microbatches: int) -> tuple[list[torch.Tensor], float | None]:
    """One One-Forward-One-Backward training step of `stage` over `num_microbatches` micro-batches.

    Rank r runs min(p - r - 1, m) warm-up forwards, then alternates one forward and one backward, then
    runs the remaining backwards (the cool-down), so that it never holds more than min(p - r, m)
    micro-batches whose backward has not run. Use `p2p_communicate` (q11; its combined operations in
    the steady state), `stage.forward` and `stage.backward`. Loss, scaling and return value are those
    of `afab_step` (q08): on the last stage `(outputs, loss)` with each micro-batch's output (detached,
    in micro-batch order) and the total loss as a float; on other stages `([], None)`.
    """


@_exercise_api("q14")
def dp_pp_step(grid: lab_src.topics.dp_pp.grid.Grid,
               cfg: lab_src.LabConfig) -> tuple[lab_src.PipelineStage, list[torch.Tensor], float | None]:
    """One training step of this rank on a grid of `grid.dp_size` data-parallel replicas of a
    `grid.pp_size`-stage pipeline (`grid.world_size` = dp_size * pp_size ranks). Return `(stage, outputs, loss)`.

    1. Coordinates: global rank = dp_rank * pp_size + pp_rank (the layout of
       `torch.arange(world_size).view(dp_size, pp_size)`: a pipeline is a row, a data-parallel set a column).
    2. Groups, with `grid.new_group(ranks)` (collective: every rank creates every group, in the same order):
       one per pipeline (its pp_size ranks), one per data-parallel set (the dp_size ranks that hold the same
       stage), and with `cfg.tie_embeddings` and more than one stage, one per pipeline of its first and
       last stage.
    3. The stage: `PipelineStage(cfg, pp_rank, pp_size, micro_batch_size, grid.device, pipeline_group)`,
       with the same `cfg` (and so the same seed and weights) on every replica; each replica's micro-batch
       size is cfg.global_batch_size / (dp_size * cfg.num_microbatches).
    4. Data: the stages that need it read their replica's own shard, `make_dataloader(cfg, micro_batch_size,
       dp_rank=dp_rank)`.
    5. The pipelined step: `afab_step(stage, data_iter, cfg.num_microbatches)` (q08).
    6. Tied embeddings: on the first and last stage, sum the gradient of `stage.tied_embedding` over the
       group of the first and last stage of this pipeline, so that both copies hold the whole gradient.
    7. Data parallelism: average every parameter's gradient over this stage's data-parallel set.
    Reduce with `grid.all_reduce(tensor, group, kind, op="sum" or "avg")`, kind "tied" or "dp".
    `outputs` and `loss` are what afab_step returned on this rank (the last stage: this replica's outputs
    and the loss of its shard; other stages: [] and None). After the step every gradient equals the
    single-process baseline's over the whole global batch, on every rank, tied copies included.
    """


@_exercise_api("q15")
def interleaved_step(stage: lab_src.topics.interleaved.chunked.InterleavedStage, data_iter: Iterator[torch.Tensor] | None,
                     num_microbatches: int) -> tuple[list[torch.Tensor], float | None]:
    """One Interleaved 1F1B training step of a rank that holds `stage.num_chunks` model chunks.

    `stage` is an `InterleavedStage` (lab_src/topics/interleaved/chunked.py) of rank `stage.pp_rank` of
    `stage.pp_size`: its chunk c is virtual stage c * pp_size + pp_rank of num_chunks * pp_size, so the
    next virtual stage is on rank (pp_rank + 1) % pp_size and the previous one on (pp_rank - 1) % pp_size.
    Virtual stage 0 (chunk 0 of rank 0) reads its micro-batches of tokens from `data_iter` (None on the
    other ranks); every other chunk receives its input from the previous virtual stage. Use
    `stage.forward(x, chunk=c, microbatch=mb)`, `stage.backward(x, y, grad, chunk=c, microbatch=mb)`,
    `stage.send(tensor, dst=..., operation=..., microbatch=mb, chunk=c)` and
    `stage.recv(src=..., shape=stage.activation_shape, operation=..., microbatch=mb, chunk=c)`; or, to let a
    message travel while the rank computes, `stage.post_recv(...)` (recv's arguments) ahead of time and its
    `.wait()` when the tensor is needed.

    Order the operations as Interleaved 1F1B (`num_microbatches` is a multiple of pp_size): forwards take
    chunk 0 for micro-batches 0..p-1, then chunk 1 for the same group, ..., then the next group;
    backwards the same with the chunks in reverse; rank r first runs min((p - r - 1) * 2 + (v - 1) * p,
    m * v) forwards, then one forward and one backward in turn, then the remaining backwards.

    The loss of a micro-batch is the mean of the last virtual stage's output divided by
    `num_microbatches`. Return `(outputs, loss)`: on the last rank the list of each micro-batch's output
    (detached, in micro-batch order) and the total loss as a float; on other ranks `([], None)`.
    """


@_exercise_api("q13")
def train_pipeline(stage: lab_src.topics.training.classifier.ClassifierStage, data: lab_src.topics.training.digits.Digits,
                   step_fn: Callable[..., tuple[list[torch.Tensor], float | None]], num_steps: int,
                   lr: float) -> dict[str, list[float] | float] | None:
    """Train this rank's `stage` for `num_steps` optimizer steps on the digits, then evaluate it on the
    held-out images. Every rank of the pipeline runs this function at once.

    `stage` is a `ClassifierStage`: a `PipelineStage` whose last stage ends in the loss (given the
    step's labels with `stage.set_labels(...)`, its forward returns each image's cross-entropy; with
    `set_labels(None)`, the ten class scores). `data` is a `Digits`. `step_fn(stage, data_iter,
    num_microbatches)` is the pipelined step (q08's afab_step, or another schedule's with its contract),
    which waits for the stage's messages before it returns.

    - One `torch.optim.AdamW` over this stage's own parameters, with learning rate `lr` (PyTorch's
      defaults otherwise), created once.
    - Each step `k`: zero the gradients; the first stage iterates over `data.train_tokens(k)`, the last
      stage gets `stage.set_labels(data.train_labels(k))` (no other stage reads either); run `step_fn`
      with `data.num_microbatches`; `optimizer.step()`.
    - Then the held-out evaluation, in eval mode and without autograd: each of the
      `data.num_test_microbatches` micro-batches forward through the pipeline (`pipeline_communicate`
      and `stage.forward`), the first stage reading `data.test_tokens()`, the last `data.test_labels()`
      with its labels set to None, so that its forward returns class scores.

    Return on the last stage `{"losses": [the loss of each step], "test_loss": the mean held-out
    cross-entropy, "test_accuracy": the share of held-out images classified right}`; None elsewhere.
    """


@_exercise_api("q16")
def zero_bubble_step(stage: lab_src.PipelineStage, data_iter: Iterator[torch.Tensor] | None,
                     num_microbatches: int) -> tuple[list[torch.Tensor], float | None]:
    """One ZB-H1 (zero bubble) training step of `stage` over `num_microbatches` micro-batches.

    Each backward is split in two: `stage.backward_input(x, y, grad, microbatch=mb)` (I) returns the gradient
    of the stage's input, which goes to the previous stage at once; `stage.backward_weight(microbatch=mb)`
    (W), after it, accumulates the weights' gradients. The stage runs the two functions the same answer
    cell defines: `backward_input(stage, input_tensor, output_tensor, output_grad)`, returning `(input_grad,
    kept)` with `kept` only what W needs (input_grad None on the first stage, whose input is tokens), and
    `backward_weight(stage, kept)`, which adds each weight's gradient into its `.grad` as `backward()` does.

    Order (the "zbh1" schedule of lab_src/pipeline/schedules.py): 1F1B's warm-up of min(p - r - 1, m)
    forwards, then one forward and one I in turn, then the remaining I's; on rank r the W of backward
    number k runs right after the I of backward number k + r, and the last r W's at the end, so that a rank
    holds at most min(p, m) micro-batches between their forward and their W. Messages with `stage.send`,
    `stage.recv` (or `post_recv`); loss, scaling and return value are those of `afab_step` (q08): on the
    last stage `(outputs, loss)`, on other stages `([], None)`.
    """


@_exercise_api("q17")
def tp_layers(up: nn.Linear, down: nn.Linear, tp: lab_src.topics.tensor_parallel.runtime.TensorParallel) -> nn.Module:
    """The MLP of one block, `down(gelu(up(x)))`, split over the tensor-parallel group `tp`: return this
    rank's part of it, an `nn.Module` whose `up` is a `ColumnParallelLinear` of `up` and whose `down` a
    `RowParallelLinear` of `down`, and whose forward takes the whole input x (the same on every rank) and
    returns the whole output on every rank, with exactly one all-reduce in its forward and one in its
    backward. `up` and `down` are the unsharded `nn.Linear` layers (hidden -> 4 hidden -> hidden), the
    same on every rank; `tp` has `rank`, `size` (t), `group` and `device` (topics/tensor_parallel/runtime.py).

    The answer cell defines, beside tp_layers, with torch.distributed's collectives over `tp.group`:
    - `CopyToTensorParallel`, a `torch.autograd.Function`: `CopyToTensorParallel.apply(x, tp)` returns x
      unchanged; its backward sums the incoming gradients over the group.
    - `ReduceFromTensorParallel`, a `torch.autograd.Function`: `.apply(x, tp)` returns the sum of every
      rank's x; its backward passes the gradient through unchanged.
    - `ColumnParallelLinear(linear, tp)`, an `nn.Module` holding only rank r's slice of `linear`'s output
      features (the r-th of t equal contiguous slices: `torch.chunk`) as its parameters `weight` and
      `bias`. Its forward takes the whole input and returns this rank's slice of `linear(x)`.
    - `RowParallelLinear(linear, tp)`, an `nn.Module` holding rank r's slice of `linear`'s input features
      as its parameter `weight`, and the whole `bias`. Its forward takes this rank's slice of the input
      features and returns the whole `linear(x)` on every rank, the bias added once.
    Each rank holds 1/t of the MLP's weights; the parameters are new tensors, not the unsharded layers.
    """


@_exercise_api("q18")
def tp_block(block: lab_src.pipeline.model.Block, tp: lab_src.topics.tensor_parallel.runtime.TensorParallel,
             q17: SimpleNamespace) -> nn.Module:
    """The lab's transformer block (pipeline/model.py's `Block`: pre-norm causal attention, then the MLP,
    each with its residual) split over the tensor-parallel group `tp`: return this rank's part of it, an
    `nn.Module` whose forward takes the whole input x (b, s, h), the same on every rank, and returns the
    block's whole output on every rank, with one all-reduce after the attention and one after the MLP in
    the forward, and one before each in the backward. `block` is the unsharded block (the same on every
    rank); `tp` has `rank`, `size` (t), `group`, `device`; `q17` holds your q17 pieces: `q17.CopyToTensorParallel`,
    `q17.ReduceFromTensorParallel`, `q17.ColumnParallelLinear`, `q17.RowParallelLinear`, `q17.tp_layers`
    (in grading, the reference's).

    The module's attributes, which the lab reads:
    - `attn_norm`, `mlp_norm`: the block's two LayerNorms, replicated (every rank holds the whole of each);
    - `qkv`: column parallel by heads: rank r holds the heads of the r-th of t contiguous groups of heads,
      as `weight` (3h/t, h) and `bias` (3h/t,): its q rows, then its k rows, then its v rows;
    - `proj`: row parallel: `weight` (h, h/t), the input features (columns) of rank r's heads; `bias`
      whole, added once;
    - `mlp`: the MLP, `q17.tp_layers(block.up, block.down, tp)`.
    Dropout: when `block.dropout` > 0, in training mode, it drops the attention probabilities of this
    rank's heads, the attention's output (after `proj`) and the MLP's output, each before its residual add,
    with masks drawn by `lab_src.pipeline.dropout.keep(generator, shape, block.dropout, like)`, in that
    order, from two streams made once, with the module: `dropout.stream(block.seed, block.name)` (shared
    by the ranks) and `dropout.stream(block.seed, block.name, shard=j)` (shard j's own). Which one draws
    which mask is yours to decide: the lab checks that the masks, with the sharding undone, are exactly
    the single process's (pipeline/dropout.py defines them). In eval mode nothing is dropped.
    """


@_exercise_api("q19")
def ring_all_reduce(tensor: torch.Tensor, group: torch.distributed.ProcessGroup | None = None) -> torch.Tensor:
    """Sum `tensor` over the ranks of the process group `group` (the whole world when None), in place, with
    a ring, and return `tensor`. Every rank of the group calls it with a tensor of the same shape and dtype;
    afterwards each holds the sum of all of them, and all hold exactly the same bits.

    Only point-to-point messages (`dist.send`, `dist.recv`, `dist.isend`, `dist.irecv`,
    `dist.batch_isend_irecv`), each to the next position of the ring or from the previous one: with n ranks
    in the group and this rank at position i = `dist.get_rank(group)`, it sends to position (i + 1) % n and
    receives from (i - 1) % n. Positions are ranks of the group, not global ranks (`group_dst=` /
    `group_src=`, or `dist.get_global_rank(group, j)`). A collective of torch.distributed is not allowed.

    The algorithm: split the flattened tensor into n chunks (any length, fewer elements than ranks
    included), then n - 1 steps of reduce-scatter (each step sends one chunk and adds the one received),
    after which each rank holds one chunk of the sum, then n - 1 steps of all-gather (each step passes on a
    chunk of the sum). That is 2(n - 1) messages from each rank, none larger than a chunk, about 2(n - 1)/n
    of the tensor's bytes in all. A group of one rank returns `tensor` untouched, without a message.
    """


@_exercise_api("q20")
def bucketed_step(stage: lab_src.PipelineStage, data_iter: Iterator[torch.Tensor] | None, num_microbatches: int,
                  reducer) -> tuple[list[torch.Tensor], float | None]:
    """One 1F1B training step of `stage` (your q12, with `p2p_communicate`) on one replica of a data x pipeline
    grid, whose gradients `reducer` averages over the stage's data-parallel replicas while the backward runs.
    Return what q12's step returns: on the last stage `(outputs, loss)`, elsewhere `([], None)`.

    - Call `reducer.arm()` just before the stage's last backward of the step (micro-batch m - 1's, the last
      one a 1F1B stage runs: before it, no parameter's gradient is final) and `reducer.finish()` after the
      cool-down, before returning. Nothing else of the reduction belongs in the step.

    The answer cell also defines `class Reducer`, built once by the lab, before the first step:
    - `Reducer(stage, dp, cap_bytes)`: `stage` is an `nn.Module` (its `named_parameters()` in declaration
      order); `dp` a `DataParallel` (topics/data_parallel/bucket_ring.py): `dp.size`, `dp.rank`, `dp.group`
      and `dp.launch(buffer)`, which hands a contiguous tensor to the rank's reducing thread and returns a
      handle at once; the thread sums the buffer over the group in place with your q19 `ring_all_reduce`,
      one launched buffer after another, and `handle.wait()` returns when it is done.
    - `reducer.buckets`: the plan, made once in `__init__`, a list of lists of parameter names: the
      parameters that need a gradient, in reverse declaration order (the order a backward finishes them),
      each joining the open bucket while it stays within `cap_bytes` bytes of gradients (a parameter larger
      than the cap alone in a bucket of its own); frozen parameters (requires_grad False) in none.
    - Hooks (`param.register_post_accumulate_grad_hook`): once armed, each parameter whose gradient is
      accumulated is final; a bucket whose parameters are all final is launched as one flattened buffer, in
      the plan's order (a bucket launches when it and every bucket before it are full), so that every
      replica launches the same buckets in the same order. Unarmed, a hook does nothing.
    - `reducer.finish()`: wait for every launched bucket, write its sum divided by `dp.size` back into each
      parameter's `.grad` (each gradient averaged exactly once), and disarm, so the next step starts unarmed.
      With tied embeddings, where the stage holds the tied weight (`stage.tied_embedding` is not None: the
      first and the last stage), then sum its averaged gradient over this replica's first and last stage with
      `dp.sum_tied(grad)`, once every bucket is written back.
    After the step every gradient equals the single-process gradient of the whole global batch, on every
    replica; one ring per bucket per step, none before the stage's last backward begins.
    """


@_exercise_api("q21")
def sharded_adamw_step(params: list[nn.Parameter], dp: lab_src.topics.sharding.kind.DataParallelGroup, state: dict,
                       lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                       weight_decay: float = 0.01) -> None:
    """One AdamW step of this rank's `params` with AdamW's state (ZeRO-1) and the reduced gradients (ZeRO-2)
    sharded over the data-parallel group `dp`. Every rank of `dp.group` calls it, under torch.no_grad(), with its
    replica's copy of the same parameters, in the same order, each `.grad` holding that replica's own gradient.
    Return nothing.

    - The flat vector: the parameters' elements in order, flattened (N elements in all). Its n = `dp.size`
      shards are those of `torch.tensor_split` on N elements (uneven sizes: the first N % n one element
      longer); the rank at position `dp.rank` owns shard `dp.rank`.
    - Reduce-scatter the flat gradient in a ring of point-to-point messages over `dp.group` (the first half of
      q19's ring, its chunks the shards, arranged so that each rank ends with its own shard of the sum), and
      divide by n: this rank's shard of the replicas' average gradient.
    - AdamW on the rank's shard alone, as `torch.optim.AdamW(lr=lr, betas=betas, eps=eps,
      weight_decay=weight_decay)` does it (the defaults are torch's; the lab passes others too):
      p *= 1 - lr * weight_decay, then the bias-corrected update. Keep its state in `state`, a dict of yours that
      the lab hands back at every call (empty at the first): the two moments of this rank's shard only, and the
      step count. The parameters are held to one process's AdamW within rtol 1e-5 plus 1% of lr per step taken:
      `m.lerp_(g, 1 - b1)` (torch's) and `m.mul_(b1).add_(g, alpha=1 - b1)` differ in the last bit, and both
      pass.
    - All-gather the updated shards in a ring (the second half of q19's ring) and write the whole flat vector
      back into the parameters.
    - Free the gradients: every `p.grad = None`.
    Only `dist.send`, `recv`, `isend`, `irecv` and `batch_isend_irecv`, to the next position of the ring and
    from the previous one (`group_dst=` / `group_src=` on `dp.group`): 2(n - 1) messages from each rank, about
    2(n - 1)/n of the parameters' bytes, as much as one all-reduce of the gradients. `dp` also has `dp.ranks`,
    the group's global ranks in position order.
    """


@_exercise_api("q22")
def fsdp_layer(layer: lab_src.pipeline.model.Block, dp: lab_src.topics.sharding.fsdp.FsdpGroup) -> nn.Module:
    """Return an `nn.Module` that stands for `layer` (one transformer block of a pipeline stage: its forward
    takes x and returns the block's output) and holds only this rank's shard of the block's parameters, as
    `self.shard`: an nn.Parameter, the elements `torch.tensor_split` gives shard `dp.rank` of `dp.size` of the
    block's parameters flattened in `layer.named_parameters()` order. Nothing else of the block's parameters may
    stay allocated (free the originals: `p.data = torch.empty(0)`, or build the module without them).

    - Forward: `full = dp.all_gather(self.shard)` (the whole flat vector, a new tensor), the block's forward with
      those weights (`torch.func.functional_call` on views of `full`), then free `full`: keep no reference once
      the forward returns.
    - Backward: gather again, compute the gradients of the block's input and of its flat weights (recomputing
      the block's forward from the saved input is the simplest way), `dp.reduce_scatter(flat_grad)` (the sum over
      the group, this rank's shard), divided by `dp.size`: that is the gradient the shard receives. Free the
      gathered weights again.
    Every micro-batch's forward and backward gathers (one gather each), and every backward reduce-scatters once;
    the shard's gradient accumulates over the micro-batches as any parameter's does. The lab averages the
    replicated parameters (embedding, head) and takes the optimizer step. `dp.all_gather` and `dp.reduce_scatter`
    run on your q19 `ring_all_reduce` over `dp.group` (in grading, the reference's): a gather is the ring's
    all-reduce of the whole flat vector, zero but for this rank's shard; a reduce-scatter the ring's all-reduce
    and a slice.
    """


@_exercise_api("q23")
def recompute_block(block: lab_src.pipeline.model.Block, mode: str) -> nn.Module:
    """Return an `nn.Module` whose forward(x) computes `block(x)` (x: (b, s, h), the lab's transformer block of
    pipeline/model.py, in training mode, dropout on or off) and whose backward gives exactly the plain block's
    gradients, of x and of the block's own parameters (the same `nn.Parameter`s, not copies), while keeping for
    the backward what `mode` says:

    - "none": what the block keeps itself (the module may be the block);
    - "selective": everything but the attention core's inside: the core (QK^T, the scaling, the causal mask,
      softmax, dropout, PV) keeps only its inputs q, k, v and its output, and is recomputed in the backward;
    - "full": the block's input x only; the whole forward is recomputed in the backward.
    Any other mode raises ValueError. What is judged is behaviour: the bytes kept are at most the mode's (the plain
    block's; its less the core's s^2-sized tensors; the input's), and the matmul work the backward adds is none,
    at most the core's two products (QK^T and PV), and one whole forward. Keeping less for no more matmul work (a
    policy that also recomputes GELU or the residual masks) is allowed.

    Dropout: the block draws its masks from generators it holds, `block.streams` (pipeline/dropout.py: made on the
    first forward that drops; make them yourself with `dropout.Streams(block.seed, block.name,
    block.dropout_shards)` if you need them before). A recomputation must draw the same masks as the forward it
    repeats, and leave the generators where they were before it, since other micro-batches' forwards draw from
    them too. torch.utils.checkpoint (reentrant or not) and its selective policy
    (`create_selective_checkpoint_contexts`) are allowed; their `preserve_rng_state` restores torch's global
    RNG, not these generators: save and restore their states (`Generator.get_state` / `set_state`) yourself.

    The lab measures, around your module: the bytes its forward leaves alive for the backward (every storage,
    wherever it is kept, and the input), the matmul FLOPs of its forward and backward, and its outputs and
    gradients with micro-batches in flight at once (forward A, forward B, backward B, backward A, forward C).
    The answer cell also defines `predicted_saved_bytes()`, your prediction, graded.

    **Sequence parallelism.** The answer cell also defines `sp_block(block, tp)`: rank `tp.rank`'s part of the block
    on t = `tp.size` ranks (`tp.group` their process group, as q17's), an `nn.Module` whose forward takes x, this
    rank's sequence shard (b, s/t, h: positions [r s/t, (r + 1) s/t) of every sequence), and returns its positions
    of the block's output, with the block's gradients (of x, and of the parts below, each its shard of the block's).
    Its parts, read by name: `attn_norm`, `mlp_norm` (whole), `qkv` (column parallel by heads: weight (3h/t, h),
    the q, k and v rows of rank r's heads), `proj` (row parallel: weight (h, h/t), bias whole), `up` (column
    parallel: (4h/t, h)), `down` (row parallel: (h, 4h/t), bias whole). The LayerNorms and the residual dropouts
    run on the shard; an all-gather along the sequence before qkv and up, a reduce-scatter along it after proj and
    down (`dist.all_gather_single`, `dist.reduce_scatter_single` over `tp.group`), and the reverse in the backward.
    A column-parallel layer keeps only its shard for the backward (and gathers it again there); the gradients of
    the parameters every rank holds whole (the LayerNorms, proj's and down's biases) are summed over `tp.group` by
    the end of the backward. With dropout on, in training mode, the masks are one process's: the attention mask of
    rank r's heads over the whole sequence from `dropout.stream(block.seed, block.name, shard=r)`, and each residual
    mask the rank's positions of the (b, s, h) mask drawn from `dropout.stream(block.seed, block.name)`. The lab
    judges each rank's numbers against one process's block, the replicated gradients on every rank, the bytes its
    forward saved for the backward (e (18 sbh + 3 a s^2 b + 4 sb)/t + s^2, e the element's bytes) and its
    collectives (two all-gathers and two reduce-scatters forward; two reduce-scatters and four all-gathers backward,
    and the replicated gradients' all-reduces). `predicted_sp_saved_bytes()`, graded too, predicts what one of
    t = 4 ranks keeps with tensor parallelism and with sequence parallelism.
    """


@_exercise_api("q24")
def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, layout: str,
                   group) -> torch.Tensor:
    """Attention over a sequence split across the N ranks of `group`, by a ring: this rank's rows of
    `softmax(q k^T / sqrt(D) [+ causal mask]) v` for its own queries against every key of the sequence.

    q, k, v: (b, H, S/N, D), this rank's rows of every head, as torch's `scaled_dot_product_attention` takes them.
    The sequence is cut into chunks of equal length: `layout="contiguous"`, N chunks, rank r holds chunk r;
    `layout="zigzag"`, 2N chunks, rank r holds chunk r followed by chunk 2N - 1 - r (so that under a causal mask
    every rank has the same work). `causal`: a query at global position i sees the keys at positions <= i.
    Returns this rank's rows of the output, (b, H, S/N, D), differentiable: its backward gives q, k and v their
    gradients (write it as a `torch.autograd.Function`). Any other layout raises ValueError.

    The ring: each rank keeps its queries; the K and V blocks go round the ring, each rank sending the block it
    holds to the next rank ((r + 1) % N of the group) and receiving the next one from the previous rank, with
    that receive posted before it computes on the block it holds. Partial results of a row are merged by their
    log-sum-exp. A block in which a row sees no key gives that row output 0 and log-sum-exp -inf, never NaN;
    blocks in which the rank's queries see no key are not computed. The backward sends K and V round again and
    the gradients dK and dV round the ring with them, home to the rank that holds the block. Use point-to-point
    messages of torch.distributed (`dist.isend`/`irecv`, `batch_isend_irecv`) over `group`; no collective.

    When S is no multiple of the chunks, the lab pads the sequence at its end with zero rows to the next multiple
    and judges the real rows only: under a causal mask no real query sees a padded key, so the answer needs no
    special case (non-causal runs come on whole chunks only).

    The answer cell also defines `ulysses_attention(q, k, v, causal, group)`: the same result and shapes on
    contiguous shards, by an all-to-all from sequence shards to head shards (each rank then holds H/P heads of
    the whole sequence), attention whole per head, and the reverse all-to-all back (`dist.all_to_all_single`;
    the backward the same all-to-alls reversed). With P ranks it raises ValueError naming P and the heads when
    P > H or H % P != 0. And `predicted_traffic_and_balance()`, the prediction, graded.

    The lab records every message and collective and times every matmul each rank runs (their FLOPs counted by
    torch.utils.flop_counter's formulas); bytes per rank, neighbours and work are judged from those, the values
    against one process's `scaled_dot_product_attention` in float64.
    """


@_exercise_api("q25")
def dispatch(x: torch.Tensor, routing, ep_group) -> tuple:
    """Send this rank's routed tokens to the ranks that hold their experts, in two all-to-alls over `ep_group`;
    return `(tokens, tokens_per_expert, meta)`.

    The layout: E experts over the ep ranks of `ep_group` (E a multiple of ep), L = E / ep per rank, contiguous: ep
    rank c holds experts c L .. c L + L - 1. `x` is (T, h), this rank's tokens; `routing` is what your `route`
    returned (below). First exchange the counts, in one all-to-all of integers (every rank learns how many tokens
    each other rank sends it, per local expert); then the tokens, in one uneven all-to-all
    (`torch.distributed.all_to_all_single` with split sizes), each kept assignment of a token once (a token with two
    kept experts on one rank is sent twice). Return `tokens`, the rows received, grouped per local expert (all of
    expert c L's rows, then c L + 1's, ...; within an expert in any order your combine undoes), `tokens_per_expert`,
    L ints, and `meta`, whatever your combine needs. The rows' gradients must flow back to `x` (an all-to-all in an
    autograd.Function whose backward is the reverse all-to-all). Call torch.distributed's collectives yourself: the lab
    records each, with its split sizes.

    The answer cell also defines:
    - `route(x, router, k, capacity_factor) -> Routing`: `router` is an nn.Linear(h, E). Each token's k experts are
      the top k of softmax(router(x)) over all E, its weights those k probabilities (not renormalised: the router
      learns through them). Capacity C = ceil(capacity_factor * T * k / E) assignments of this rank per expert (none
      when capacity_factor is 0): taking every token's first choice in token order, then every second choice, ..., an
      assignment whose expert already took C is dropped (keep False; its token gets nothing from that expert: a token
      dropped everywhere passes through the residual alone). Return
      `lab_src.topics.experts.moe.Routing(experts, weights, keep, E)`, each (T, k), first choices first.
    - `combine(y, meta, ep_group) -> (T, h)`: `y` is your experts' outputs, the rows of `tokens` in the same order.
      Send them back with the reverse all-to-all (the counts are known: no second exchange) and return, for each of
      this rank's tokens, the sum over its kept assignments of weight * expert output (zeros where all were dropped).
    - `sync_gradients(dense, experts, groups)`: after the backward of this rank's mean loss, make every parameter's
      .grad the gradient of the mean loss over every rank's tokens. `dense` (embedding, attention, routers, head) are
      replicated on every rank; `experts` are this rank's experts, replicated over `groups.dp` (the ranks with the same
      ep coordinate). `groups`: `.ep`, `.dp`, `.world` (process groups), `.ep_size`, `.dp_size`, `.ep_rank`,
      `.dp_rank`. Every rank reads its own tokens.
    - `predicted_moe_traffic()`, your prediction, graded: {"forward_bytes", "backward_bytes", "undivided_factor"}
      (the notebook says for which layout).
    What is judged is behaviour: outputs and gradients equal to one process's MoE, three SGD steps on its curve, one
    counts exchange and two all-to-alls of tokens per layer forward (two backward) that send exactly the kept rows
    bound off-rank, and which assignments were dropped.
    """


@_exercise_api("q26")
def mixed_precision_layer(layer: lab_src.pipeline.model.Block, dp: lab_src.topics.mixed_precision.group.MixedGroup,
                          compute_dtype: torch.dtype) -> nn.Module:
    """Return an `nn.Module` that stands for `layer` (one transformer block: forward(x) returns the block's output)
    and holds only this rank's shard of the block's parameters as `self.shard`: an nn.Parameter in **float32** (the
    master copy), the elements `torch.tensor_split` gives shard `dp.rank` of `dp.size` of the block's parameters
    flattened in `layer.named_parameters()` order (q22's). Free the block's own parameters.

    - Forward: cast the shard to `compute_dtype` (torch.bfloat16 or torch.float16) *before* the gather:
      `dp.all_gather(shard_cast)` returns the whole flat vector in that dtype (the gather carries half of
      float32's bytes). Run the block in `compute_dtype` on views of it (`torch.func.functional_call`), on the
      input cast to `compute_dtype`; return the output in **float32**. Keep no gathered copy once it returns.
    - Backward: gather the cast again, compute the gradients of the input and of the flat weights in
      `compute_dtype` (recompute from the saved input), give the input's gradient back in the input's dtype
      (float32), cast the flat gradient to **float32 before** `dp.reduce_scatter` (the replicas' gradients summed
      in float32: FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32)`), divide by `dp.size`:
      the shard's gradient, float32.
    `dp` is q22's group on your q19 ring, plus `dp.all_reduce(t)`: t summed over the group, in place. The lab's
    `torch.optim.SGD` steps the float32 shards.

    The answer cell also defines `LossScaler(dp, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
    growth_interval=2000)`, used in float16 as torch.amp.GradScaler is: `scaler.scale(loss)` (the loss times the
    scale), `scaler.step(optimizer)` (every gradient of `optimizer.param_groups` multiplied by 1 / scale; if any
    rank's holds an inf or NaN, no rank steps: agree on it over `dp`), `scaler.update()` (x backoff_factor after a
    skipped step, and the count of clean steps starts again; x growth_factor after growth_interval clean steps in a
    row), `scaler.get_scale()` (the scale now, a float). And `predicted_mixed_bytes()`, the prediction, graded.

    What is judged is behaviour: every step's gradients and update against one process computing the same casts,
    the parameters after every step against one process's float32-master training, the bytes of each gather and
    reduce-scatter as the ring carried them, the dtypes of the shard and its gradient, and in float16 the scale
    after each step and a step with an inf (the lab puts one into one rank's shard gradient) skipped on every rank.
    """


@_exercise_api("q27")
def load_sharded(folder, dp) -> dict:
    """Load a checkpoint of q21's sharded training state, written by `save_sharded` on n ranks, on the m = `dp.size`
    ranks of `dp` (m may differ from n); return this rank's state.

    The state: the model's parameters flattened in order into N elements, cut as `torch.tensor_split(flat, k)` cuts
    them over k ranks (the first N % k shards one element longer; rank r owns shard r), and q21's `state` of each
    rank: `{"step": int, "exp_avg": tensor, "exp_avg_sq": tensor}`, the moments of its own shard.
    `folder` is a `pathlib.Path` every rank sees (one file system); `dp` is q21's: `.group`, `.size`, `.rank`,
    `.ranks`.

    Return `{"step", "params", "exp_avg", "exp_avg_sq"}` for shard `dp.rank` of N over m: the step count (an int)
    and three 1-D tensors of the saved dtype, each exactly the saved elements of that shard (a load moves bytes: it
    computes nothing). The lab all-gathers the returned 'params' into the model's parameters (q21 keeps them whole
    on every rank) and hands the rest to q21's `sharded_adamw_step`, which goes on from there. Read only what this
    rank needs: its slice of each tensor, from the files of the old shards it overlaps, with reads the process's
    I/O counters see (`file.seek` and `readinto`, `os.pread`, `np.fromfile(..., offset=, count=)`; a memory map is
    not counted), plus the metadata. No collective is needed.

    The answer cell also defines:
    - `save_sharded(params, state, dp, folder)`: called by every rank of the n ranks of `dp` at once, after q21's
      steps, with the model's parameters (whole) and q21's `state` of this rank. Write this rank's shard of the flat
      parameters, its two moments and the metadata that places them in the whole (N, the shard's offset and length,
      the dtype, which tensor is where, the step count) into `folder`, in files of its own: nothing written twice
      across ranks (the state once, plus at most 4 KiB of metadata a rank), in raw bytes that a load can read a
      slice of (`tensor.view(torch.uint8).numpy()` gives a tensor's bytes).
    - `predicted_reads()`, the prediction, graded: {"bytes_rank1", "files_rank1", "whole_files_rank1"} (the
      notebook says for which checkpoint).
    What is judged is behaviour: the bytes on disk (measured by the grader), each loading rank's bytes read, the
    returned state against the saved one bitwise, and the next step against the same step taken from the state
    handed over in memory.
    """


_missing = [e.id for e in CODED if e.id not in API]
if _missing:
    raise RuntimeError(f"lab_src/exercises.py has no contract for {_missing}: declare one with @_exercise_api")
