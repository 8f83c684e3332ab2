def predicted_deadlock():
    return {"rank 0": 1, "rank 1": 0}


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    if operation.startswith("send"):
        stage.send(tensor, dst=peer, operation="send_forward" if to_next else "send_backward", microbatch=microbatch)
    if "recv" not in operation:
        return None
    single = "recv_backward" if to_next else "recv_forward"
    mb = microbatch if recv_microbatch is None else recv_microbatch
    x = stage.recv(src=peer, shape=stage.activation_shape, operation=single, microbatch=mb)
    return x.requires_grad_() if single == "recv_forward" else x
