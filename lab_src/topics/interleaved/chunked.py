"""`InterleavedStage`: what one rank of an interleaved pipeline holds, v model chunks (virtual stages).

The model is cut into V = v * p virtual stages with `distribute_layers(num_layers, s, V)` (q05), and
they are dealt out round-robin: rank r holds chunks 0..v-1, chunk c being virtual stage s = c * p + r.
So with p = 4 and v = 2, rank 0 holds virtual stages 0 and 4, rank 3 holds 3 and 7, and a micro-batch
goes round the ring of ranks v times: virtual stage 3 (rank 3, chunk 0) hands its activation to
virtual stage 4 (rank 0, chunk 1), the wrap-around from the last rank to the first.

    stage = InterleavedStage(cfg, pp_rank=1, pp_size=4, num_chunks=2, micro_batch_size=2, group=g)
    stage.virtual_stage(1)                      # 5
    y = stage.forward(x, chunk=1, microbatch=0)
    stage.send(y, dst=2, operation="send_forward", microbatch=0, chunk=1)

Virtual stage 0 (chunk 0 of rank 0) holds the embedding and reads tokens; the last virtual stage
(chunk v-1 of rank p-1) holds the head. Parameter names are the full model's (``blocks.5.up.weight``),
as on a `PipelineStage`, so gradients compare with the baseline by name.

`is_first_stage` and `is_last_stage` keep their meaning from `PipelineStage`: this *rank* is the first
or the last of the ring. Whether a *chunk* begins or ends the model is `virtual_stage(chunk) == 0` or
`== num_virtual_stages - 1`.

The stage also measures what the interleaving costs in memory: the bytes autograd keeps for the
backward of each chunk's forward (activations, not weights), how many are held at once, and the peak.
"""
from __future__ import annotations

import torch
from torch import nn

from lab_src.exercises import activation_shape, distribute_layers
from lab_src.pipeline import trace
from lab_src.pipeline.config import LabConfig
from lab_src.pipeline.model import build_piece
from lab_src.pipeline.stage import PipelineStage, _checked_layers, _checked_shape, _ranges, backward_from


class InterleavedStage(PipelineStage):
    def __init__(self, cfg: LabConfig, pp_rank: int, pp_size: int, num_chunks: int, micro_batch_size: int,
                 device="cpu", group=None):
        nn.Module.__init__(self)
        if pp_size < 2:
            raise ValueError("an interleaved pipeline needs at least 2 ranks: with one, every chunk would send to itself")
        if num_chunks < 1:
            raise ValueError(f"a rank holds at least one chunk, got num_chunks={num_chunks}")
        virtual = num_chunks * pp_size
        if cfg.num_layers < virtual:
            raise ValueError(f"{num_chunks} chunks on each of {pp_size} ranks make {virtual} virtual stages, but the "
                             f"model has only {cfg.num_layers} blocks: every virtual stage needs one")
        self.cfg = cfg
        self.pp_rank, self.pp_size, self.num_chunks = pp_rank, pp_size, num_chunks
        self.num_virtual_stages = virtual
        self.device = torch.device(device)
        self.dtype = cfg.torch_dtype
        self.group = group
        self._sends = []
        self._posted = []
        self.is_first_stage = pp_rank == 0
        self.is_last_stage = pp_rank == pp_size - 1
        self.chunk_layers = [_checked_layers(distribute_layers(cfg.num_layers, self.virtual_stage(c), virtual), cfg,
                                             self.virtual_stage(c)) for c in range(num_chunks)]
        self.layer_ids = [i for ids in self.chunk_layers for i in ids]
        self.activation_shape = _checked_shape(activation_shape(cfg, micro_batch_size))
        self.embed = build_piece(cfg, "embed", device) if pp_rank == 0 else None
        self.blocks = nn.ModuleDict({str(i): build_piece(cfg, f"blocks.{i}", device) for i in self.layer_ids})
        self.head = build_piece(cfg, "head", device) if self.is_last_stage else None
        self._params = {p.data_ptr() for p in self.parameters()}
        self._held: dict[tuple[int, int], int] = {}     # (micro-batch, chunk) -> activation bytes kept for backward
        self.peak_held_bytes = 0
        self.peak_held_chunks = 0
        self.waiting = None

    def virtual_stage(self, chunk: int) -> int:
        """The virtual stage that chunk `chunk` of this rank is: chunk * pp_size + pp_rank."""
        return chunk * self.pp_size + self.pp_rank

    def describe(self) -> str:
        parts = []
        for c, ids in enumerate(self.chunk_layers):
            s = self.virtual_stage(c)
            pieces = (["embed"] if s == 0 else []) + [f"blocks {_ranges(ids)}"] + \
                     (["head"] if s == self.num_virtual_stages - 1 else [])
            parts.append(f"chunk {c} = virtual stage {s}: " + ", ".join(pieces))
        return f"rank {self.pp_rank}/{self.pp_size}: " + "; ".join(parts)

    # ---- compute ---------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, microbatch: int = 0, chunk: int | None = None) -> torch.Tensor:
        chunk = self._check_chunk(chunk, "forward", microbatch)
        self._check_chunk_input(x, chunk, microbatch)
        s = self.virtual_stage(chunk)
        held = []

        def pack(t):
            if t.data_ptr() not in self._params:      # weights are kept anyway; count activations only
                held.append(t.numel() * t.element_size())
            return t

        with trace.span("forward", microbatch, None, tuple(x.shape), chunk=chunk), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if s == 0:
                x = self.embed(x)
            for i in self.chunk_layers[chunk]:
                x = self.blocks[str(i)](x)
            if s == self.num_virtual_stages - 1:
                x = self.head(x)
        self._held[(microbatch, chunk)] = sum(held)
        self.peak_held_bytes = max(self.peak_held_bytes, sum(self._held.values()))
        self.peak_held_chunks = max(self.peak_held_chunks, len(self._held))
        return x

    def backward(self, input_tensor, output_tensor, output_grad, microbatch: int = 0, chunk: int | None = None):
        chunk = self._check_chunk(chunk, "backward", microbatch)
        s = self.virtual_stage(chunk)
        where = f"rank {self.pp_rank}, chunk {chunk} (virtual stage {s}), micro-batch {microbatch}"
        if output_grad is None and output_tensor.numel() != 1:
            raise RuntimeError(
                f"{where}: backward got no output gradient for a non-scalar output of shape "
                f"{tuple(output_tensor.shape)}. Only the last virtual stage (chunk {self.num_chunks - 1} of rank "
                f"{self.pp_size - 1}) starts from its loss; every other chunk back-propagates the gradient it "
                f"receives from the next virtual stage (recv_backward).")
        if not output_tensor.requires_grad:
            raise RuntimeError(f"{where}: the output passed to backward does not require grad. Pass the tensor "
                               f"stage.forward returned (or the loss computed from it), not a detached copy.")
        receives_grad = input_tensor is not None and input_tensor.is_floating_point()
        if receives_grad and not input_tensor.requires_grad:
            raise RuntimeError(f"{where}: the activation this chunk received does not require grad, so backward "
                               f"cannot compute the gradient for virtual stage {s - 1}. Call .requires_grad_() on "
                               f"received activations before forward.")
        with trace.span("backward", microbatch, None, tuple(output_tensor.shape), chunk=chunk):
            if output_grad is None:
                output_tensor.backward()
            else:
                backward_from(output_tensor, output_grad)
        self._held.pop((microbatch, chunk), None)
        return input_tensor.grad if receives_grad else None

    # ---- messaging: PipelineStage's, with the chunk required -------------------------------
    def send(self, tensor, dst: int, operation: str, microbatch: int = 0, chunk: int | None = None) -> None:
        chunk = self._check_chunk(chunk, operation, microbatch)
        super().send(tensor, dst, operation, microbatch, chunk)

    def recv(self, src: int, shape, operation: str, microbatch: int = 0, chunk: int | None = None) -> torch.Tensor:
        chunk = self._check_chunk(chunk, operation, microbatch)
        return super().recv(src, shape, operation, microbatch, chunk)

    def post_recv(self, src: int, shape, operation: str, microbatch: int = 0, chunk: int | None = None):
        chunk = self._check_chunk(chunk, operation, microbatch)
        return super().post_recv(src, shape, operation, microbatch, chunk)

    # ---- checks -----------------------------------------------------------------------------
    def _check_peer(self, peer, where: str) -> None:
        if isinstance(peer, int) and not isinstance(peer, bool) and not 0 <= peer < self.pp_size:
            raise ValueError(f"{where}: there is no rank {peer}; the ranks are 0..{self.pp_size - 1}. In an "
                             f"interleaved pipeline the ranks form a ring: the virtual stage after rank "
                             f"{self.pp_size - 1}'s chunk c is rank 0's chunk c + 1 (the wrap-around), so the next "
                             f"rank is (rank + 1) % {self.pp_size} and the previous one (rank - 1) % {self.pp_size}")
        super()._check_peer(peer, where)

    def _check_chunk(self, chunk, what: str, microbatch) -> int:
        if chunk is None:
            raise TypeError(f"rank {self.pp_rank} {what}(mb={microbatch}): say which chunk it is for, e.g. "
                            f"stage.{'send' if 'send' in what else 'recv' if 'recv' in what else what}(..., "
                            f"chunk=c, microbatch=mb): this rank holds {self.num_chunks} chunks")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 <= chunk < self.num_chunks:
            raise ValueError(f"rank {self.pp_rank} {what}(mb={microbatch}): there is no chunk {chunk!r}; this rank "
                             f"holds chunks 0..{self.num_chunks - 1}")
        return chunk

    def _check_chunk_input(self, x, chunk: int, microbatch: int) -> None:
        s = self.virtual_stage(chunk)
        where = f"rank {self.pp_rank}, chunk {chunk} (virtual stage {s}), micro-batch {microbatch}"
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{where}: forward needs a tensor, got {type(x).__name__}")
        if x.device != self.device:
            raise ValueError(f"{where}: the input is on {x.device} but the stage is on {self.device}")
        if s == 0 and x.is_floating_point():
            raise ValueError(f"{where}: the first virtual stage starts from token ids out of the dataloader, "
                             f"not from floating-point activations")
        if s > 0 and not x.is_floating_point():
            prev = s - 1
            wrap = " (the wrap-around from the last rank to the first)" if self.pp_rank == 0 else ""
            raise ValueError(f"{where}: only virtual stage 0 (chunk 0 of rank 0) reads tokens; this chunk's input is "
                             f"the activation of virtual stage {prev}, which rank {prev % self.pp_size} sends from "
                             f"its chunk {prev // self.pp_size}{wrap}. Rank r holds chunks r, r + p, r + 2p, ...")
        if s > 0 and tuple(x.shape) != self.activation_shape:
            raise ValueError(f"{where}: the input has shape {tuple(x.shape)}, not the activation shape "
                             f"{self.activation_shape}")
