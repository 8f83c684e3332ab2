import torch
import torch.distributed as dist


def predicted_deadlock():
    return {"rank 0": 1, "rank 1": 0}


def p2p_communicate(operation, stage, tensor=None, microbatch=0, recv_microbatch=None):
    to_next = operation in ("send_forward", "recv_backward", "send_forward_recv_backward")
    if (to_next and stage.is_last_stage) or (not to_next and stage.is_first_stage):
        return None
    peer = stage.pp_rank + 1 if to_next else stage.pp_rank - 1
    ops, received = [], None
    if operation.startswith("send"):
        ops.append(dist.P2POp(dist.isend, tensor.detach(), group=stage.group, group_peer=peer))
    if "recv" in operation:
        received = torch.zeros(stage.activation_shape, requires_grad=operation.endswith("recv_forward"))
        ops.append(dist.P2POp(dist.irecv, received, group=stage.group, group_peer=peer))
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return received
