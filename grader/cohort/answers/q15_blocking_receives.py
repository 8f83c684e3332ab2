def interleaved_step(stage, data_iter, num_microbatches):
    """One Interleaved 1F1B step of this rank's chunks; returns (outputs, loss)."""
    p, r, v, m = stage.pp_size, stage.pp_rank, stage.num_chunks, num_microbatches
    first, last = 0, v * p - 1                      # the virtual stages that begin and end the model

    def virtual(chunk):                             # rank r holds chunks r, r + p, r + 2p, ...
        return chunk * p + r

    def order(k, backward):
        """(micro-batch, chunk) of this rank's k-th forward (or backward)."""
        group, pos = divmod(k, p * v)               # groups of p micro-batches, each through all v chunks
        mb, chunk = group * p + pos % p, pos // p
        return mb, (v - 1 - chunk if backward else chunk)

    def communicate(op, chunk, mb, tensor=None):
        """Q7's four operations for one chunk; the ring's neighbours are (r - 1) % p and (r + 1) % p."""
        s = virtual(chunk)
        if op == "recv_forward" and s != first:
            return stage.recv(src=(r - 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb, chunk=chunk)
        if op == "send_forward" and s != last:
            stage.send(tensor, dst=(r + 1) % p, operation=op, microbatch=mb, chunk=chunk)
        if op == "recv_backward" and s != last:
            return stage.recv(src=(r + 1) % p, shape=stage.activation_shape, operation=op, microbatch=mb, chunk=chunk)
        if op == "send_backward" and s != first:
            stage.send(tensor, dst=(r - 1) % p, operation=op, microbatch=mb, chunk=chunk)
        return None

    kept, logits, losses = {}, {}, []

    def forward(k):
        mb, chunk = order(k, backward=False)
        x = communicate("recv_forward", chunk, mb)
        if x is None:                               # virtual stage 0: tokens from the dataloader
            x = next(data_iter).to(stage.device)
        else:
            x.requires_grad_()
        y = stage.forward(x, chunk=chunk, microbatch=mb)
        communicate("send_forward", chunk, mb, y)
        if virtual(chunk) == last:
            logits[mb] = y.detach()
            y = y.mean() / m                        # this micro-batch's share of the batch mean
            losses.append(float(y))
        kept[mb, chunk] = (x, y)

    def backward(k):
        mb, chunk = order(k, backward=True)
        grad = communicate("recv_backward", chunk, mb)
        x, y = kept.pop((mb, chunk))
        input_grad = stage.backward(x, y, grad, chunk=chunk, microbatch=mb)
        communicate("send_backward", chunk, mb, input_grad)

    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)
    for k in range(warmup):
        forward(k)
    for i in range(total - warmup):
        forward(warmup + i)
        backward(i)
    for k in range(total - warmup, total):
        backward(k)
    if stage.is_last_stage:
        return [logits[mb] for mb in range(m)], sum(losses)
    return [], None


def predicted_interleaving():
    """For p = 4 ranks and m = 8 micro-batches: the idle share (p-1)/(v·m+p-1) and the messages 2m(v·p-1)."""
    return {"bubble_v1": 3 / 11, "bubble_v2": 3 / 19, "bubble_v4": 3 / 35,
            "messages_v1": 48, "messages_v2": 112, "messages_v4": 240}
