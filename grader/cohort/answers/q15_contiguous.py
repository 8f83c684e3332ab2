def interleaved_step(stage, data_iter, num_microbatches):
    # rank r holds the virtual stages r*v .. r*v + v-1: each chunk feeds the next one on the same rank
    p, r, v, m = stage.pp_size, stage.pp_rank, stage.num_chunks, num_microbatches
    last = v * p - 1

    def virtual(chunk):
        return r * v + chunk

    def order(k, backward):
        group, within = divmod(k, p * v)
        chunk = within // p
        return group * p + within % p, (v - 1 - chunk if backward else chunk)

    kept, handed, grads, logits, losses = {}, {}, {}, {}, []

    def forward(k):
        mb, chunk = order(k, False)
        if virtual(chunk) == 0:
            x = next(data_iter).to(stage.device)
        elif chunk > 0:                                  # the output of my own previous chunk
            x = handed.pop((mb, chunk - 1)).detach().requires_grad_()
        else:
            x = stage.recv(src=r - 1, shape=stage.activation_shape, operation="recv_forward", microbatch=mb,
                           chunk=chunk)
            x.requires_grad_()
        y = stage.forward(x, chunk=chunk, microbatch=mb)
        if virtual(chunk) == last:
            logits[mb] = y.detach()
            y = y.mean() / m
            losses.append(float(y))
        elif chunk < v - 1:
            handed[mb, chunk] = y
        else:
            stage.send(y, dst=r + 1, operation="send_forward", microbatch=mb, chunk=chunk)
        kept[mb, chunk] = (x, y)

    def backward(k):
        mb, chunk = order(k, True)
        if virtual(chunk) == last:
            grad = None
        elif chunk < v - 1:                              # from my own next chunk
            grad = grads.pop((mb, chunk + 1))
        else:
            grad = stage.recv(src=r + 1, shape=stage.activation_shape, operation="recv_backward", microbatch=mb,
                              chunk=chunk)
        x, y = kept.pop((mb, chunk))
        g = stage.backward(x, y, grad, chunk=chunk, microbatch=mb)
        if chunk > 0:
            grads[mb, chunk] = g
        elif virtual(chunk) > 0:
            stage.send(g, dst=r - 1, operation="send_backward", microbatch=mb, chunk=chunk)

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
