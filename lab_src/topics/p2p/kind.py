"""Kind "p2p" (q11): every rank calls `p2p_communicate` in the order of the case's schedule, no compute.

The calls are the schedule's messages as `topics/p2p/calls.py` writes them: a send and a receive from the
same neighbour with no compute between them as one combined operation (1F1B's steady state), or, with the
probe "single", the four single operations only. Each send carries a tensor filled with a
label that says who sent it, for which micro-batch and in which direction; each receive records what
arrived and how its buffer was allocated (shape, dtype, device, requires_grad), and the case counts the
messages made with torch.distributed's own calls (not through stage.send / stage.recv). The ends' no-ops are
probed first: on the first stage the operations towards the previous stage, on the last those towards
the next, must return None without a message. The messages themselves are recorded by the wrappers of
comm/messages.py, whatever torch.distributed calls the answer makes.
"""
from __future__ import annotations

import torch

from lab_src import exercises
from lab_src.comm import messages as msgs
from lab_src.harness import observe
from lab_src.harness.case import Case
from lab_src.pipeline.schedules import Op
from lab_src.topics.p2p.calls import COMBINED, calls


def read_buffer(value) -> dict | None:
    """What a receive returned: the label it carries and how its buffer was made."""
    if value is None:
        return None
    got = observe.read_label(value)
    if isinstance(value, torch.Tensor):
        got.update(dtype=str(value.dtype).replace("torch.", ""), device=value.device.type,
                   requires_grad=bool(value.requires_grad))
    return got


def _noops(stage) -> list[str]:
    out = []
    for name in ("recv_forward", "send_backward", "send_backward_recv_forward",
                 "send_forward", "recv_backward", "send_forward_recv_backward"):
        towards_next = (COMBINED.get(name) or (Op(name),))[0].towards_next
        if (stage.is_last_stage and towards_next) or (stage.is_first_stage and not towards_next):
            out.append(name)
    return out


def _probe_noop_ends(stage, tracer) -> dict:
    """The operations towards the missing neighbour at either end must return None without messaging."""
    dummy = torch.zeros(stage.activation_shape, dtype=stage.dtype, device=stage.device)
    start, out = len(tracer.events), {}
    for name in _noops(stage):
        before = len(tracer.events)
        tensor = dummy if name.startswith("send") else None
        out[name] = observe.attempt(exercises.p2p_communicate, name, stage, tensor=tensor, microbatch=0)
        out[name]["messages"] = len(tracer.events) - before
    del tracer.events[start:]  # probes are not part of the schedule
    return out


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg = case.config
    rank, p, m = ctx.rank, cfg.num_stages, cfg.num_microbatches
    try:
        stage = observe.build_stage(cfg, ctx, group, obs)
        obs["probes"] = {"noop_ends": _probe_noop_ends(stage, tracer)}
        observe.barrier(group)
        done = obs["calls"] = []
        raw_before = msgs.RECORDED[0]
        for call in calls(case.schedule, rank, p, m, combined="single" not in case.probes):
            send = next((op for op in call.parts if op.is_send), None)
            tensor = observe.label_tensor(stage, rank, call.microbatch, send.phase) if send else None
            kwargs = {"recv_microbatch": call.recv_microbatch} if call.operation in COMBINED else {}
            before = len(tracer.events)
            got = exercises.p2p_communicate(call.operation, stage, tensor=tensor, microbatch=call.microbatch,
                                            **kwargs)
            done.append([call.operation, call.microbatch, call.recv_microbatch, read_buffer(got),
                         [[e.kind, e.microbatch] for e in tracer.events[before:]]])
            obs["raw_messages"] = msgs.RECORDED[0] - raw_before   # made with torch.distributed's own calls
        observe.finish_messages(None, group, tracer)
    finally:
        observe.record_instrumentation(obs, tracer)
