from lab_src import pipeline_communicate


def afab_step(stage, data_iter, num_microbatches):
    inputs, outputs, logits = [], [], []
    for mb in range(num_microbatches):
        x = pipeline_communicate("recv_forward", stage, microbatch=mb)
        if x is None:
            x = next(data_iter).to(stage.device)
        else:
            x.requires_grad_()
        y = stage.forward(x, microbatch=mb)
        pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
        if stage.is_last_stage:
            logits.append(y.detach())
            y = y.mean()                      # each micro-batch's mean, not divided by the count
        inputs.append(x)
        outputs.append(y)
    for mb in range(num_microbatches):
        grad = pipeline_communicate("recv_backward", stage, microbatch=mb)
        g = stage.backward(inputs[mb], outputs[mb], grad, microbatch=mb)
        pipeline_communicate("send_backward", stage, tensor=g, microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(float(o) for o in outputs) / num_microbatches
    return [], None
