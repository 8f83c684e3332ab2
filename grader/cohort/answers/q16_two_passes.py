# the split done the first way: W runs a second backward from the output
import torch
from torch.autograd.graph import GradientEdge


def backward_input(stage, input_tensor, output_tensor, output_grad):
    """I, the first way: the input's gradient, keeping the whole graph for a second pass."""
    grad = torch.ones_like(output_tensor) if output_grad is None else output_grad
    if input_tensor is None or not input_tensor.is_floating_point():
        return None, (output_tensor, grad)
    (input_grad,) = torch.autograd.grad(output_tensor, input_tensor, grad, retain_graph=True)
    return input_grad, (output_tensor, grad)


def backward_weight(stage, kept):
    """W, the first way: a second pass from the output, which redoes the input's path on the way."""
    output_tensor, grad = kept
    params = [p for p in stage.parameters() if p.requires_grad]
    for p, g in zip(params, torch.autograd.grad(output_tensor, params, grad, allow_unused=True)):
        if g is not None:
            p.grad = g if p.grad is None else p.grad.add_(g)


def zero_bubble_step(stage, data_iter, num_microbatches):
    """One ZB-H1 step of this stage; returns (outputs, loss)."""
    m, p, r = num_microbatches, stage.pp_size, stage.pp_rank
    warmup = min(p - r - 1, m)
    shape = stage.activation_shape
    inputs, outputs, logits, losses, done = {}, {}, [], [], []

    def forward(mb):
        if stage.is_first_stage:
            x = next(data_iter).to(stage.device)
        else:
            x = stage.recv(r - 1, shape, "recv_forward", mb).requires_grad_()
        y = stage.forward(x, microbatch=mb)
        inputs[mb] = x
        if stage.is_last_stage:
            logits.append(y.detach())
            outputs[mb] = y.mean() / m
            losses.append(float(outputs[mb].detach()))
        else:
            outputs[mb] = y
            stage.send(y, r + 1, "send_forward", mb)

    def backward(mb):
        grad = None if stage.is_last_stage else stage.recv(r + 1, shape, "recv_backward", mb)
        input_grad = stage.backward_input(inputs.pop(mb), outputs.pop(mb), grad, microbatch=mb)
        if not stage.is_first_stage:
            stage.send(input_grad, r - 1, "send_backward", mb)      # the previous stage waits for it: now
        done.append(mb)
        if len(done) > r:                        # rank r runs its W's r backwards late
            stage.backward_weight(microbatch=done[len(done) - 1 - r])

    for mb in range(warmup):
        forward(mb)
    for i in range(m - warmup):
        forward(warmup + i)
        backward(i)
    for mb in range(m - warmup, m):
        backward(mb)
    for mb in done[max(0, len(done) - r):]:      # the W's left: where 1F1B would wait
        stage.backward_weight(microbatch=mb)
    if stage.is_last_stage:
        return logits, sum(losses)
    return [], None
