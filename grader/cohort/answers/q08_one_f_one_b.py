from lab_src import pipeline_communicate


def afab_step(stage, data_iter, num_microbatches):
    m = num_microbatches
    warmup = min(stage.pp_size - stage.pp_rank - 1, m)
    inputs, outputs, logits = {}, {}, []

    def forward(mb):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        if x is None:
            x = next(data_iter).to(stage.device)
        else:
            x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean() / m
        inputs[mb], outputs[mb] = x, y

    def backward(mb):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        input_grad = stage.backward(inputs.pop(mb), outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=input_grad, microbatch=mb)

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
    if stage.is_last_stage:
        return logits, sum(float(outputs[mb]) for mb in range(m))
    return [], None
