"""Rank side of q22 (fsdp_layer): on a data x pipeline grid of all the case's ranks (q14's layout), every block of
each replica's stage is replaced by the answer's `fsdp_layer(block, dp)`, which keeps only this rank's shard of the
block's flat parameters (`module.shard`). Then, `steps` times: each replica's 1F1B step (q12; in grading the
reference's), the replicated parameters (embedding, head) averaged over the data-parallel group by the lab, a
record, and one SGD step of every parameter the stage holds (the shards among them). With the setting "digits",
the stages are the digit classifier's (topics/training) and the steps a training run: each replica reads its share
of each step's batch of images, and AdamW (lr from the settings) steps every parameter the stage holds; the last
stage records each step's loss, which the judge holds to one process's curve.

Recorded per rank (plain values, never a verdict): each block's flat length and its shard's; the bytes the stage's
parameters hold at rest; and per step the whole gradient of every parameter (each block's rebuilt from the ranks'
shards of it, by the lab's own gather), every gather and reduce-scatter the answer asked for (time, layer, bytes),
the most gathered bytes held at once and which layers, how long each layer's gathered copy lived at most, and the
gathered copies still held after the step (FsdpGroup, fsdp.py).
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

from lab_src import exercises
from lab_src.comm import collectives as coll
from lab_src.comm.grid import grid_case
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.harness.live import LiveTensors, addresses
from lab_src.harness.settings import settings_of
from lab_src.pipeline import waiting
from lab_src.pipeline.stage import PipelineStage
from lab_src.topics.sharding.fsdp import FsdpGroup
from lab_src.topics.sharding.kind import grad_bytes, held_bytes, reachable_addresses, storage_bytes
from lab_src.topics.sharding.records import chunk_bounds, shard_bounds

SGD_LR = 0.1    # topics/data_parallel/judge_buckets.py's, whose one-process gradients the judge compares with


def layout_error(name: str, shard, flat: torch.Tensor, n: int, rank: int) -> None:
    """Raise, naming the layout, where the answer's shard holds the elements of another shard than the contract's
    (torch.tensor_split's shard dp.rank of the block's flat parameters): another rank's shard (rank r + 1's: q19's
    reduce-scatter as it is), or torch.chunk's piece dp.rank (other sizes where N % n != 0). Read from the values
    the block had before the answer freed them; a shard that matches no known layout is left to the checks after."""
    if not isinstance(shard, torch.Tensor) or shard.dim() != 1:
        return
    held, total = shard.detach().cpu(), flat.numel()
    start, end = shard_bounds(total, n, rank)
    if held.numel() == end - start and torch.equal(held, flat[start:end]):
        return
    contract = (f"the contract's shard {rank} is torch.tensor_split's: the {end - start:,} elements {start:,} to "
                f"{end - 1:,} of the block's {total:,} flattened parameters")
    c_start, c_end = chunk_bounds(total, n, rank)
    if (c_start, c_end) != (start, end) and held.numel() == c_end - c_start and torch.equal(held, flat[c_start:c_end]):
        raise ValueError(f"the shard of {name} was cut with torch.chunk: it holds elements {c_start:,} to {c_end - 1:,} "
                         f"(torch.chunk's piece {rank}: ceil(N / n) = {-(-total // n):,} elements each, the last "
                         f"shorter); {contract} (the first N % n = {total % n} shards one element longer), where "
                         f"dp.all_gather puts it")
    for j in range(n):
        j_start, j_end = shard_bounds(total, n, j)
        if j != rank and held.numel() == j_end - j_start and torch.equal(held, flat[j_start:j_end]):
            cause = ("q19's ring as it is (its reduce-scatter leaves rank r with chunk r + 1 whole): "
                     if j == (rank + 1) % n else "")
            raise ValueError(f"{cause}the shard of {name} holds shard {j}'s elements ({j_start:,} to {j_end - 1:,}), "
                             f"not shard dp.rank = {rank}'s; {contract}, where dp.all_gather puts it and "
                             f"dp.reduce_scatter returns its gradient")


def recomputed_without_grad(error: BaseException) -> bool:
    """Whether `error` is torch.autograd.grad (or .backward) called inside a torch.autograd.Function's backward on
    outputs that do not require grad: a forward recomputed there without torch.enable_grad() (autograd runs a
    Function's backward with grad disabled, so the recomputation builds no graph). Read from the traceback's frames
    (which functions, and the tensors they were given), never from the message."""
    import torch.autograd.function as function
    calls = {torch.autograd.grad.__code__: "outputs", torch.autograd.backward.__code__: "tensors"}
    in_backward, tb = False, error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code is function.BackwardCFunction.apply.__code__:
            in_backward = True
        elif in_backward and code in calls:
            given = tb.tb_frame.f_locals.get(calls[code])
            given = [given] if isinstance(given, torch.Tensor) else list(given or ()) \
                if isinstance(given, (list, tuple)) else []
            tensors = [t for t in given if isinstance(t, torch.Tensor)]
            return bool(tensors) and not any(t.requires_grad for t in tensors)
        tb = tb.tb_next
    return False


def no_graph_error(error: BaseException, dp: FsdpGroup) -> RuntimeError:
    layer = dp.gathers[-1][1] if dp.gathers else "a block"
    return RuntimeError(
        f"the backward of {layer} recomputed the block's forward with grad disabled, so the recomputation built no "
        f"graph and torch.autograd.grad was given outputs that do not require grad: autograd runs a Function's "
        f"backward under no_grad. Run the recomputation (from the saved input and the weights gathered again) "
        f"inside `with torch.enable_grad():`").with_traceback(error.__traceback__)


def wrap_blocks(stage: PipelineStage, dp: FsdpGroup, obs: dict) -> dict:
    """Replace each block by the answer's module; {block name: [(parameter name, shape)]} of the originals."""
    layout, layers = {}, {}
    n = dp.size
    for key in list(stage.blocks.keys()):
        block = stage.blocks[key]
        name = f"blocks.{key}"
        params = [(p_name, tuple(p.shape), p.numel()) for p_name, p in block.named_parameters()]
        total = sum(k for _, _, k in params)
        flat = torch.cat([p.detach().reshape(-1) for p in block.parameters()]).cpu().clone()   # before it is freed
        wrapped = exercises.fsdp_layer(block, dp)
        if not isinstance(wrapped, nn.Module):
            raise TypeError(f"fsdp_layer must return an nn.Module standing for the block, got {type(wrapped).__name__}")
        shard = getattr(wrapped, "shard", None)
        start, end = shard_bounds(total, n, dp.rank)
        layout_error(name, shard, flat, n, dp.rank)
        if not isinstance(shard, nn.Parameter) or shard.dim() != 1 or shard.numel() != end - start:
            raise ValueError(f"the module fsdp_layer returns for {name} must hold its shard as `self.shard`, an "
                             f"nn.Parameter of the {end - start:,} elements {start:,} to {end:,} of the block's "
                             f"{total:,} flattened parameters (torch.tensor_split's shard {dp.rank} of {n}); it "
                             f"holds {getattr(shard, 'shape', type(shard).__name__)}")
        dp.register(name, shard, total)
        stage.blocks[key] = wrapped
        layout[name] = params
        layers[name] = [total, end - start]
    obs["layers_flat"] = layers
    return layout


def whole_grads(stage: PipelineStage, dp: FsdpGroup, layout: dict) -> dict:
    """name -> the whole gradient: the replicated parameters' own, each block's rebuilt from every rank's shard."""
    out = {}
    for name, p in stage.named_parameters():
        if not name.startswith("blocks."):
            out[name] = p.grad.detach().cpu().clone() if p.grad is not None else None
    for key, module in stage.blocks.items():
        name = f"blocks.{key}"
        shard = module.shard
        grad = shard.grad if shard.grad is not None else torch.zeros_like(shard)
        full = dp.gather_raw(grad.detach(), total=sum(k for _, _, k in layout[name]))
        offset = 0
        for p_name, shape, k in layout[name]:
            out[f"{name}.{p_name}"] = full[offset:offset + k].view(shape).cpu().clone() if shard.grad is not None \
                else None
            offset += k
    return out


def digits_step(stage, data, k: int, dp_rank: int, dp_size: int, mbs: int):
    """The data iterator of training step k for replica `dp_rank`: its share of the step's batch of digits, in
    micro-batches (the first stage reads it); the last stage gets the same images' labels."""
    tokens, labels = data.batch(k)
    share = tokens.shape[0] // dp_size
    rows = slice(dp_rank * share, (dp_rank + 1) * share)
    if stage.is_last_stage:
        stage.set_labels(list(labels[rows].split(mbs)))
    return iter(tokens[rows].split(mbs)) if stage.is_first_stage else None


def run(case: Case, ctx, group, tracer, obs) -> None:
    settings = settings_of(case)
    with grid_case(case, ctx, group, tracer, obs) as grid:
        try:
            _steps(case, ctx, group, tracer, obs, grid, settings)
        finally:
            tracer.state_memory = None


def _steps(case: Case, ctx, group, tracer, obs, grid, settings) -> None:
    dp_size, dp_rank, dp_group, mbs, m = grid.dp_size, grid.dp_rank, grid.dp_group, grid.mbs, grid.m
    training = settings.digits
    # the rank's memory beyond what the lab declared (harness/live.py), from before the stage is built
    live = LiveTensors()
    live.mark()
    if training:
        from lab_src.topics.training.classifier import ClassifierStage
        from lab_src.topics.training.digits import Digits
        stage = grid.stage(ClassifierStage)
        digits = Digits(case.config)
    else:
        stage = grid.stage()
    replicated = [p for name, p in stage.named_parameters() if not name.startswith("blocks.")]
    obs["replicated_bytes"] = storage_bytes(replicated)
    dp = FsdpGroup(dp_group, grid.dp_ranks, ctx.rank)
    dp.ring = exercises.ring_all_reduce          # the answer's q19 ring (in grading, the reference's)
    layout = wrap_blocks(stage, dp, obs)
    seen: set = set()
    for p in replicated:
        held_bytes(p, seen)
    obs["rest_bytes"] = obs["replicated_bytes"] + sum(held_bytes(block, seen, skip=(dp,))[0]
                                                      for block in stage.blocks.values())
    reduce = coll.lab("all_reduce")
    optimizer = torch.optim.AdamW(stage.parameters(), lr=settings.lr) if training else None
    # every event carries the training state the rank holds (the timeline's memory lane): what it keeps at
    # rest, the gathered copies alive, the gradients, AdamW's state in a training; the gathers are events too
    held = list(stage.parameters())
    dp.tracer = tracer
    tracer.state_memory = lambda: (obs["rest_bytes"], dp.gathered_bytes(), grad_bytes(held),
                                   held_bytes(optimizer.state)[0] if optimizer is not None else 0)
    steps = obs["steps"] = []
    # at the first gather of a backward (the boundary of forwards and backwards: every micro-batch in flight has run
    # its forwards), in the first and the last step: every live tensor storage but the parameters, their gradients,
    # the gathered copies the lab watches, the optimizer's state, the lab's records and data, the activations (the
    # autograd graph's tensors, what autograd saved) and what was there before the stage was built. A copy of the
    # weights kept for the backward where the watch does not see it (a clone, a closure, a global) shows here. A
    # scan costs a few milliseconds (the first of a process more: harness/live.py): two a case
    hidden: list = []

    def scan(layer: str) -> None:
        dp.on_backward_gather = None
        known = (addresses(held) | addresses(p.grad for p in held if p.grad is not None) | dp.gathered_addresses()
                 | reachable_addresses(obs, optimizer.state if training else None, digits if training else None))
        found = live.scan(known)
        hidden[:] = [found.bytes, layer, found.storages, found.largest]
    for k in range(settings.steps):
        observe.barrier(group)
        for p in stage.parameters():
            p.grad = None
        if training:
            data_iter = digits_step(stage, digits, k, dp_rank, dp_size, mbs)
        else:
            data_iter = grid.data_iter(stage)
        dp.new_step()
        obs["stepping"] = k
        hidden.clear()
        scanned = k in (0, settings.steps - 1)
        dp.on_backward_gather = scan if scanned else None
        # autograd's saved tensors noted only in the steps scanned (a Python call for each one saved)
        with live.saving() if scanned else contextlib.nullcontext():
            try:
                returned = exercises.one_f_one_b_step(stage, data_iter, m)
            except RuntimeError as e:
                if recomputed_without_grad(e):
                    raise no_graph_error(e, dp) from None
                raise
        for p in replicated:              # the lab's part: the parameters every rank holds whole, averaged
            if p.grad is not None and dp.size > 1:
                waiting.wait(reduce(p.grad, group=dp_group, async_op=True))
                p.grad /= dp.size
        steps.append({
            "gathers": [list(g) for g in dp.gathers], "scatters": [list(s) for s in dp.scatters],
            "peak": dp.peak, "peak_layers": list(dp.peak_layers), "longest": dict(dp.longest),
            "left": dp.gathered_now(),
            "hidden": list(hidden),
        })
        if training:
            steps[-1]["loss"] = observe.unpack_step(returned, obs)[1] if stage.is_last_stage else None
            optimizer.step()
            continue
        steps[-1]["grads"] = whole_grads(stage, dp, layout)
        with torch.no_grad():
            for p in stage.parameters():
                if p.grad is not None:
                    p -= SGD_LR * p.grad
    obs.pop("stepping", None)
    obs["scan_seconds"] = live.seconds
    grid.finish(stage)
