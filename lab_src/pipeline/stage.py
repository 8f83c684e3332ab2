"""`PipelineStage`: the part of the model one pipeline rank holds, and its messaging.

A stage asks `distribute_layers` (q05) which blocks it owns and builds only those (plus the embedding
on the first stage, the norm and head on the last). Parameter names are the full model's
(``blocks.5.up.weight``), so a stage's gradients can be looked up in the baseline by name.

Autograd cannot follow a tensor from one process to another, so a stage runs its backward by hand:
`backward(input, output, output_grad)` back-propagates `output_grad` (received from the next stage)
through this stage's part of the graph and returns the gradient of `input`, to send to the previous
stage. On the last stage `output` is the loss and `output_grad` is None.

`send` and `recv` take the model chunk they work for (0 unless the rank holds several: see
topics/interleaved/chunked.py); it is recorded with the message.

`send` and `recv` (and `post_recv`) are the only way stages exchange tensors: they are traced, and they
check what they are given, so that a mistake is reported where it happens rather than as a hang or a
wrong number three stages later. A send is posted and returns at once (the stage computes while the
message travels); `flush()` waits for all of them at the end of a step. `recv` waits for its message;
`post_recv` posts the receive and returns a handle whose `wait()` gives the tensor later, so that the
message can travel while the stage computes something else (gloo moves a message only once its receive
is posted).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lab_src.pipeline import split, trace, waiting
from lab_src.pipeline.config import LabConfig
from lab_src.exercises import activation_shape, distribute_layers
from lab_src.pipeline.model import build_piece
from lab_src.pipeline.ops import Op


class PipelineStage(nn.Module):
    def __init__(self, cfg: LabConfig, pp_rank: int, pp_size: int, micro_batch_size: int,
                 device="cpu", group=None):
        super().__init__()
        self.cfg = cfg
        self.pp_rank = pp_rank
        self.pp_size = pp_size
        self.device = torch.device(device)
        self.dtype = cfg.torch_dtype
        self.group = group
        self._sends = []          # sends posted and not yet known to be delivered (see send and flush)
        self._posted = []         # receives posted with post_recv and not yet waited for
        self.waiting = None       # [operation, micro-batch, chunk] of the receive it waits in (for a stopped run)
        self._kept_for_w = {}     # micro-batch -> what backward_input kept for its backward_weight (q16)
        self.is_first_stage = pp_rank == 0
        self.is_last_stage = pp_rank == pp_size - 1
        self.layer_ids = _checked_layers(distribute_layers(cfg.num_layers, pp_rank, pp_size), cfg, pp_rank)
        self.activation_shape = _checked_shape(activation_shape(cfg, micro_batch_size))
        self.embed = build_piece(cfg, "embed", device) if self.is_first_stage else None
        self.blocks = nn.ModuleDict({str(i): build_piece(cfg, f"blocks.{i}", device) for i in self.layer_ids})
        self.head = build_piece(cfg, "head", device) if self.is_last_stage else None
        if cfg.tie_embeddings and self.embed is not None and self.head is not None:
            self.head.proj.weight = self.embed.tokens.weight    # one stage holds both uses: one parameter

    @property
    def tied_embedding(self):
        """With `cfg.tie_embeddings`, this stage's copy of the weight shared by the token embedding (first
        stage) and the output projection (last stage); None on the stages in between, or untied. A
        one-stage pipeline holds a single parameter used twice. (q14)"""
        if not self.cfg.tie_embeddings:
            return None
        if self.embed is not None:
            return self.embed.tokens.weight
        return self.head.proj.weight if self.head is not None else None

    def describe(self) -> str:
        parts = (["embed"] if self.embed is not None else []) + \
                [f"blocks {_ranges(self.layer_ids)}" if self.layer_ids else "no blocks"] + \
                (["head"] if self.head is not None else [])
        return f"stage {self.pp_rank}/{self.pp_size}: " + ", ".join(parts)

    # ---- compute ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, microbatch: int = 0) -> torch.Tensor:
        self._check_input(x, microbatch)
        with trace.span("forward", microbatch, None, tuple(x.shape)):
            if self.embed is not None:
                x = self.embed(x)
            for block in self.blocks.values():
                x = block(x)
            if self.head is not None:
                x = self.head(x)
        return x

    def backward(self, input_tensor, output_tensor, output_grad, microbatch: int = 0):
        """Back-propagate `output_grad` through this stage's layers; return the gradient of `input_tensor`
        (what the previous stage needs), or None on the first stage, whose input is token ids."""
        self._check_backward(input_tensor, output_tensor, output_grad, microbatch)
        with trace.span("backward", microbatch, None, tuple(output_tensor.shape)):
            if output_grad is None:             # the last stage: output_tensor is its loss
                output_tensor.backward()
            else:
                backward_from(output_tensor, output_grad)
        receives_grad = input_tensor is not None and input_tensor.is_floating_point()
        return input_tensor.grad if receives_grad else None

    def backward_input(self, input_tensor, output_tensor, output_grad, microbatch: int = 0):
        """The first half of a split backward (zero bubble, q16), I: the gradient of `input_tensor` only,
        returned to send to the previous stage (None on the first stage). It runs your q16
        `backward_input(stage, input_tensor, output_tensor, output_grad)`, which returns `(input_grad,
        kept)`; the stage keeps `kept` for `backward_weight(microbatch)`, the second half."""
        self._check_backward(input_tensor, output_tensor, output_grad, microbatch)
        if microbatch in self._kept_for_w:
            raise RuntimeError(f"stage {self.pp_rank}, micro-batch {microbatch}: backward_input ran twice for this "
                               f"micro-batch before its backward_weight: pass each call the micro-batch it works on")
        fn = split.half("backward_input")
        with trace.span(Op.BACKWARD_INPUT.value, microbatch, None, tuple(output_tensor.shape)):
            result = fn(self, input_tensor, output_tensor, output_grad)
        input_grad, kept = split.unpack_input_half(result, self.pp_rank, microbatch)
        self._kept_for_w[microbatch] = (kept, split.graph_freed(output_tensor))
        return input_grad

    def backward_weight(self, microbatch: int = 0) -> None:
        """The second half of a split backward, W: the gradients of this stage's weights for
        `microbatch`, accumulated into their .grad, from what `backward_input` kept for it. It runs your
        q16 `backward_weight(stage, kept)`; afterwards the stage lets go of what was kept."""
        where = f"stage {self.pp_rank}, micro-batch {microbatch}"
        if microbatch not in self._kept_for_w:
            raise RuntimeError(split.before_input_message(where, microbatch))
        kept, freed = self._kept_for_w.pop(microbatch)
        if freed:
            raise RuntimeError(split.graph_freed_message(where, microbatch))
        fn = split.half("backward_weight")
        with trace.span(Op.BACKWARD_WEIGHT.value, microbatch, None, None):
            fn(self, kept)
        del kept

    # ---- messaging -------------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, operation: str, microbatch: int = 0, chunk: int = 0) -> None:
        where = f"stage {self.pp_rank} {trace.op_text(operation, microbatch, chunk)}"
        self._check_peer(dst, where)
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{where}: there is no tensor to send (got {type(tensor).__name__}). "
                            f"Is this an operation the stage should skip?")
        if tuple(tensor.shape) != self.activation_shape:
            raise ValueError(f"{where}: the tensor to send has shape {tuple(tensor.shape)}, but receivers "
                             f"allocate activation_shape = {self.activation_shape} (q03)")
        if tensor.dtype != self.dtype:
            raise ValueError(f"{where}: the tensor to send is {tensor.dtype}; the pipeline runs in {self.dtype}")
        data = tensor.detach().contiguous()
        with trace.span(operation, microbatch, dst, tuple(data.shape), data.numel() * data.element_size(), chunk):
            # Posted, not waited for: the stage goes on computing while the message travels. `data` is
            # an activation kept for backward (or an input gradient), never changed afterwards.
            self._sends.append((dist.isend(data, group=self.group, group_dst=dst), data,
                                (operation, microbatch, dst, chunk)))

    def flush(self) -> None:
        """Wait until every message this stage sent has been delivered (the end of a step). A send not
        delivered yet is journalled as the wait it is (trace.delivering), for the deadlock watch: a peer
        that raised posts no receive for it. Only where the stage's ranks are the launch's: the journal
        names peers by their rank in the stage's group, which the watch reads as the launch's ranks, and
        in a grid (q14) a pipeline group's ranks are not those."""
        if self._posted:
            left = ", ".join(f"{trace.op_text(r.operation, r.microbatch, r.chunk)} from rank {r.src}"
                             for r in self._posted)
            self._posted.clear()
            raise RuntimeError(f"stage {self.pp_rank}: the step ended with receives posted and never waited for: "
                               f"{left}. Call .wait() on what post_recv returns, before the compute that needs it")
        while self._sends:
            work, _, (operation, microbatch, dst, chunk) = self._sends[0]
            if work.is_completed() or not self._ranks_are_the_launchs():
                waiting.wait(work)
            else:
                with trace.delivering(operation, microbatch, dst, chunk):
                    waiting.wait(work)
            self._sends.pop(0)

    def _ranks_are_the_launchs(self) -> bool:
        """Whether each rank of the stage's group is the same rank of the launch (its default group)."""
        if self.group is None:
            return True
        try:
            return all(dist.get_global_rank(self.group, r) == r for r in range(self.pp_size))
        except (RuntimeError, ValueError):
            return False

    def recv(self, src: int, shape, operation: str, microbatch: int = 0, chunk: int = 0) -> torch.Tensor:
        where = f"stage {self.pp_rank} {trace.op_text(operation, microbatch, chunk)}"
        self._check_peer(src, where)
        shape = tuple(int(s) for s in shape)
        buffer = torch.empty(shape, dtype=self.dtype, device=self.device)
        self.waiting = [operation, microbatch, chunk]
        with trace.span(operation, microbatch, src, shape, buffer.numel() * buffer.element_size(), chunk):
            waiting.wait(dist.irecv(buffer, group=self.group, group_src=src))
        self.waiting = None
        return buffer

    def post_recv(self, src: int, shape, operation: str, microbatch: int = 0, chunk: int = 0) -> "PostedRecv":
        """Post a receive now and wait for it later: `stage.post_recv(...).wait()` returns what
        `stage.recv(...)` would. gloo moves a message only once its receive is posted, so a receive posted
        before the compute that comes ahead of its use lets the message travel during that compute
        (torch.distributed.pipelining's schedules post theirs ahead too). Messages from one rank land in
        the receives in the order they were posted, whatever order they are waited in."""
        self._check_peer(src, f"stage {self.pp_rank} {trace.op_text(operation, microbatch, chunk)}")
        shape = tuple(int(s) for s in shape)
        buffer = torch.empty(shape, dtype=self.dtype, device=self.device)
        posted = trace.Posted(operation, microbatch, src, shape, buffer.numel() * buffer.element_size(), chunk)
        with posted.posting():
            work = dist.irecv(buffer, group=self.group, group_src=src)
        received = PostedRecv(self, buffer, work, posted, src, operation, microbatch, chunk)
        self._posted.append(received)
        return received

    # ---- checks that turn a hang or a wrong number into a message ---------------------------
    def _check_peer(self, peer, where: str) -> None:
        if self.group is None:
            raise RuntimeError(f"{where}: this stage was built outside a torchrun run and cannot communicate")
        if not isinstance(peer, int) or isinstance(peer, bool):
            raise TypeError(f"{where}: the peer must be a pipeline rank (an int), got {peer!r}")
        if not 0 <= peer < self.pp_size:
            raise ValueError(f"{where}: there is no stage {peer}; the stages are 0..{self.pp_size - 1}. "
                             f"The first stage has no previous stage and the last no next one.")
        if peer == self.pp_rank:
            raise ValueError(f"{where}: a stage cannot send to or receive from itself")

    def _check_backward(self, input_tensor, output_tensor, output_grad, microbatch: int) -> None:
        where = f"stage {self.pp_rank}, micro-batch {microbatch}"
        if output_grad is None and output_tensor.numel() != 1:
            raise RuntimeError(
                f"{where}: backward got no output gradient for a non-scalar output of shape "
                f"{tuple(output_tensor.shape)}. Only the last stage starts from its loss; every other "
                f"stage back-propagates the gradient it receives with recv_backward (q07, q08).")
        if not output_tensor.requires_grad:
            raise RuntimeError(f"{where}: the output passed to backward does not require grad. Pass the "
                               f"tensor stage.forward returned (or the loss computed from it), not a detached copy.")
        receives_grad = input_tensor is not None and input_tensor.is_floating_point()
        if receives_grad and not input_tensor.requires_grad:
            raise RuntimeError(
                f"{where}: the activation this stage received does not require grad, so backward cannot "
                f"compute the gradient to send back to stage {self.pp_rank - 1}, whose layers would get "
                f"no gradient at all. Call .requires_grad_() on received activations before forward (q08).")

    def _check_input(self, x, microbatch: int) -> None:
        where = f"stage {self.pp_rank}, micro-batch {microbatch}"
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{where}: forward needs a tensor, got {type(x).__name__}")
        if x.device != self.device:
            raise ValueError(f"{where}: the input is on {x.device} but the stage is on {self.device}; "
                             f"move it with .to(stage.device)")
        if self.is_first_stage and x.is_floating_point():
            raise ValueError(f"{where}: the first stage starts from token ids out of the dataloader, "
                             f"not from floating-point activations")
        if not self.is_first_stage and not x.is_floating_point():
            raise ValueError(f"{where}: only the first stage reads tokens; this stage's input is the "
                             f"activation received from stage {self.pp_rank - 1}")


def backward_from(output: torch.Tensor, grad: torch.Tensor) -> None:
    """torch.autograd.backward(output, grad): back-propagate `grad`, the gradient of some later loss with
    respect to `output`, through the graph that made `output`. Written as the backward of a scalar whose
    gradient with respect to `output` is exactly `grad`, because passing grad_tensors makes PyTorch import
    sympy (0.4 s) on a process's first backward."""
    if not isinstance(grad, torch.Tensor) or grad.shape != output.shape:
        got = f"shape {tuple(grad.shape)}" if isinstance(grad, torch.Tensor) else f"a {type(grad).__name__}"
        raise ValueError(f"the output gradient passed to backward is {got}, but the output it belongs to has shape "
                         f"{tuple(output.shape)}: pass the gradient received for this output (recv_backward)")
    _Seed.apply(output, grad).backward()


class _Seed(torch.autograd.Function):
    """A zero scalar made from `output`; its backward hands `grad` to `output` as is (see backward_from)."""

    @staticmethod
    def forward(ctx, output, grad):
        ctx.grad = grad                     # an attribute, not a saved tensor: not counted as activation memory
        return output.new_zeros(())

    @staticmethod
    def backward(ctx, _):
        return ctx.grad, None


class PostedRecv:
    """A receive `PipelineStage.post_recv` posted; `wait()` returns the received tensor."""

    def __init__(self, stage, buffer, work, posted, src, operation, microbatch, chunk):
        self.stage, self.buffer, self.work, self.posted = stage, buffer, work, posted
        self.src, self.operation, self.microbatch, self.chunk = src, operation, microbatch, chunk
        self.done = False

    def wait(self) -> torch.Tensor:
        if not self.done:
            # the receives from one peer fill in the order they were posted: wait for the earlier ones first,
            # so that the record (and the check's reading of it) keeps that order
            for earlier in [r for r in self.stage._posted if r.src == self.src]:
                if earlier is self:
                    break
                earlier._wait()
            self._wait()
        return self.buffer

    def _wait(self) -> None:
        self.stage.waiting = [self.operation, self.microbatch, self.chunk]
        with self.posted.waited():
            waiting.wait(self.work)
        self.done = True
        if self in self.stage._posted:
            self.stage._posted.remove(self)
        self.stage.waiting = None


def _checked_layers(layer_ids, cfg: LabConfig, pp_rank: int) -> list[int]:
    try:
        ids = [int(i) for i in layer_ids]
    except (TypeError, ValueError):
        raise TypeError(f"q05: distribute_layers must return a list of block indices, got {layer_ids!r}") from None
    bad = [i for i in ids if not 0 <= i < cfg.num_layers]
    if bad:
        raise ValueError(f"q05: stage {pp_rank} was given blocks {bad}, but the model has blocks "
                         f"0..{cfg.num_layers - 1}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"q05: stage {pp_rank} was given the same block twice: {ids}")
    return ids


def _checked_shape(shape) -> tuple:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise TypeError(f"q03: activation_shape must return a tuple of ints, got {shape!r}") from None
    if not out or any(s < 1 for s in out):
        raise ValueError(f"q03: activation_shape returned {out}, which no tensor can have")
    return out


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'"""
    out, start = [], None
    for i, v in enumerate(ids):
        if start is None:
            start = v
        if i + 1 == len(ids) or ids[i + 1] != v + 1:
            out.append(f"{start}-{v}" if v != start else f"{v}")
            start = None
    return ", ".join(out)
