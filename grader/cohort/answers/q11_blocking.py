import torch
import torch.distributed as dist


def predicted_deadlock():
    return {"rank 0": 1, "rank 1": 0}


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    # plain blocking calls, in order: first send, then receive
    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    if operation.startswith("send"):
        dist.send(tensor.detach(), group=stage.group, group_dst=peer)
    if "recv" not in operation:
        return None
    buffer = torch.empty(stage.activation_shape, dtype=stage.dtype, device=stage.device,
                         requires_grad=operation.endswith("recv_forward"))
    dist.recv(buffer, group=stage.group, group_src=peer)
    return buffer
