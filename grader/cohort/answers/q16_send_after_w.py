# the input's gradient goes to the previous stage only after this rank's W
import torch
from torch.autograd.graph import GradientEdge


def backward_input(stage, input_tensor, output_tensor, output_grad):
    """I: the gradient of the stage's input only. Returns (input_grad, kept): kept is what W needs."""
    def node_of(t):      # the node that receives t's gradient: its grad_fn, or a leaf's gradient accumulator
        return t.grad_fn if t.grad_fn is not None else t.view_as(t).grad_fn.next_functions[0][0]

    def below(root):     # every node reachable from root
        seen, todo = {}, [root]
        while todo:
            node = todo.pop()
            if node is not None and node not in seen:
                seen[node] = True
                todo += [f for f, _ in node.next_functions]
        return list(seen)

    def reaching(nodes, targets):   # the nodes from which one of `targets` can be reached
        parents = {}
        for node in nodes:
            for f, _ in node.next_functions:
                if f is not None:
                    parents.setdefault(f, []).append(node)
        found, todo = set(), [t for t in targets if t in parents]
        while todo:
            node = todo.pop()
            if node not in found:
                found.add(node)
                todo += parents.get(node, [])
        return found

    grad = torch.ones_like(output_tensor) if output_grad is None else output_grad
    params = [p for p in stage.parameters() if p.requires_grad]
    if input_tensor is None or not input_tensor.is_floating_point():
        return None, ("whole", output_tensor, grad, params)     # first stage: tokens in, W does all the work
    target = node_of(input_tensor)
    weights = {node_of(p): p for p in params}
    nodes = below(output_tensor.grad_fn)
    to_input, to_weight = reaching(nodes, {target}), reaching(nodes, set(weights))
    # where the path from the output to the input branches off towards weights: the gradients arriving
    # at those nodes are all that W needs, so W starts there and never redoes the input's path
    branches = {}
    for node in nodes:
        off = [f for f, _ in node.next_functions if f is not None and f not in to_input and f in to_weight]
        if node in to_input and off:
            branches[node] = list({id(w): w for f in off for n in below(f) if n in weights
                                   for w in [weights[n]]}.values())
    caught = {}
    handles = [node.register_prehook(lambda g, node=node: caught.__setitem__(node, g)) for node in branches]
    try:
        (input_grad,) = torch.autograd.grad(output_tensor, input_tensor, grad, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return input_grad, ("branches", [(node, caught[node], ws) for node, ws in branches.items() if node in caught])


def backward_weight(stage, kept):
    """W: the weights' gradients from what backward_input kept, accumulated into .grad."""
    def accumulate(params, grads):
        for p, g in zip(params, grads):
            if g is not None:
                p.grad = g if p.grad is None else p.grad.add_(g)

    how, *rest = kept
    if how == "whole":
        output_tensor, grad, params = rest
        accumulate(params, torch.autograd.grad(output_tensor, params, grad, allow_unused=True))
        return
    for node, grads, ws in rest[0]:
        edges = [(GradientEdge(node, i), g) for i, g in enumerate(grads) if g is not None]
        accumulate(ws, torch.autograd.grad([e for e, _ in edges], ws, [g for _, g in edges], allow_unused=True))


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
        done.append(mb)
        if len(done) > r:                        # rank r runs its W's r backwards late
            stage.backward_weight(microbatch=done[len(done) - 1 - r])
        if not stage.is_first_stage:
            stage.send(input_grad, r - 1, "send_backward", mb)

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
