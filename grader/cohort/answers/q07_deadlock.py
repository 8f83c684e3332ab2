def pipeline_communicate(operation, stage, tensor=None, microbatch=0):
    # receives the gradient from the previous stage instead of the next one: every middle rank waits forever
    if operation == "recv_forward":
        if stage.is_first_stage:
            return None
        return stage.recv(src=stage.pp_rank - 1, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_forward":
        if not stage.is_last_stage:
            stage.send(tensor, dst=stage.pp_rank + 1, operation=operation, microbatch=microbatch)
        return None
    if operation == "recv_backward":
        if stage.is_last_stage:
            return None
        peer = stage.pp_rank - 1 if stage.pp_rank > 0 else stage.pp_rank + 1
        return stage.recv(src=peer, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_backward":
        if not stage.is_first_stage:
            stage.send(tensor, dst=stage.pp_rank - 1, operation=operation, microbatch=microbatch)
        return None
