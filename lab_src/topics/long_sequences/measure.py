"""Rank side of q23: what a block keeps for its backward and what its forward and backward cost, measured by the
lab around the answer's module (never reported by it).

    kept(module, x, known)     bytes alive after the forward, each storage once: what autograd saved (the lab's
                               saved_tensors_hooks) and every other tensor the forward left alive (harness/live.py:
                               a tensor kept on ctx, in a closure, in torch.utils.checkpoint's cache) and the
                               input (every backward of a block needs it), less the parameters and the output
    flops(module, x)           matmul FLOPs of the forward and of the backward (torch.utils.flop_counter), the
                               backward's including any recomputation
    make_block, inputs         the lab's block of a case and its three micro-batches, alike in a rank and in the judge
    sequence(module, block, xs)  forward A, forward B, backward B, backward A, forward and backward C
"""
from __future__ import annotations

import gc
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from lab_src.harness.live import LiveTensors, addresses
from lab_src.harness.memory import SavedBytes
from lab_src.pipeline.model import build_piece
from lab_src.topics.long_sequences.records import shape_of



def kept(module, x: torch.Tensor, known=()) -> dict:
    """Run `module(x)` and measure what it keeps: {"bytes": all it left alive, "saved": what autograd saved, each
    storage once, "storages": how many, "largest": bytes of the largest}. The output is dropped after."""
    known = addresses(list(known))
    live = LiveTensors()
    gc.collect()
    live.mark()
    counter = SavedBytes(known)
    with live.saving(), torch.autograd.graph.saved_tensors_hooks(counter.pack, counter.unpack):
        y = module(x)
    found = live.grown(known | addresses([x]) | addresses([y] if isinstance(y, torch.Tensor) else []))
    saved = counter.now
    del y
    # the input counts as kept whatever keeps it (autograd, a checkpoint, ctx): every backward of a block needs it,
    # and in a model it is the previous block's output, alive only because this block keeps it
    held = found.bytes + x.untyped_storage().nbytes()
    return {"bytes": held, "saved": saved, "storages": found.storages + 1, "largest": max(found.largest, x.untyped_storage().nbytes())}


def flops(module, x: torch.Tensor) -> dict:
    """Matmul FLOPs (torch's FlopCounterMode: mm, bmm, addmm, attention) of `module(x)`'s forward and of the
    backward of its output's sum, and the seconds each took."""
    counter = FlopCounterMode(display=False)
    with counter:
        t0 = time.perf_counter()
        y = module(x)
        t1 = time.perf_counter()
        forward = counter.get_total_flops()
        y.float().sum().backward()
        t2 = time.perf_counter()
    total = counter.get_total_flops()
    return {"forward": forward, "backward": total - forward, "forward_s": t1 - t0, "backward_s": t2 - t1}


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
BLOCK = "blocks.0"


def make_block(cfg, dtype: str):
    """The lab's block of the case (its weights from the configuration's seed), in `dtype`, in training mode."""
    return build_piece(cfg, BLOCK).to(DTYPES[dtype]).train()


def inputs(cfg, settings) -> list:
    """The three micro-batches A, B, C, drawn from the configuration's seed (judge.py draws them alike)."""
    b, s, h, _ = shape_of(cfg, settings)
    g = torch.Generator().manual_seed(1000 + cfg.seed)
    return [torch.randn(b, s, h, generator=g).to(DTYPES[settings.dtype]) for _ in range(3)]


def sequence(module, block, xs) -> dict:
    """Forward A, forward B, backward B, backward A, forward C, backward C: outputs and gradients."""
    xs = [x.clone().requires_grad_() for x in xs]
    ya = module(xs[0])
    yb = module(xs[1])
    yb.float().sum().backward()
    ya.float().sum().backward()
    yc = module(xs[2])
    yc.float().sum().backward()
    return {"outputs": [detached(y) for y in (ya, yb, yc)], "input_grads": [detached(x.grad) for x in xs],
            "grads": {n: detached(p.grad) for n, p in block.named_parameters()}}


def detached(v):
    return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else None
