def pipeline_communicate(operation, stage, tensor=None, microbatch=0):
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
        return stage.recv(src=stage.pp_rank + 1, shape=stage.activation_shape, operation=operation, microbatch=microbatch)
    if operation == "send_backward":
        # forgot: the first stage has nobody to send to
        stage.send(tensor, dst=stage.pp_rank - 1, operation=operation, microbatch=microbatch)
        return None
