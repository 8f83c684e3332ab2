# q17: an all-reduce after each layer, the column-parallel one too (its outputs are slices, not partial sums)
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class CopyToTensorParallel(torch.autograd.Function):
    """Identity forward; the backward sums the gradients over the tensor-parallel group."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.tp.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Sum over the tensor-parallel group forward; identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=tp.group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Rank r's slice of the output features of `linear`."""

    def __init__(self, linear, tp):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=0)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().chunk(tp.size, dim=0)[tp.rank].clone())

    def forward(self, x):
        out = F.linear(CopyToTensorParallel.apply(x, self.tp), self.weight, self.bias)
        return ReduceFromTensorParallel.apply(out, self.tp)     # "reduce after every parallel layer"


class RowParallelLinear(nn.Module):
    """Rank r's slice of the input features of `linear`; the whole bias, added once."""

    def __init__(self, linear, tp):
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(linear.weight.detach().chunk(tp.size, dim=1)[tp.rank].clone())
        self.bias = nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        return ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.tp) + self.bias


class TensorParallelMLP(nn.Module):
    def __init__(self, up, down, tp):
        super().__init__()
        self.up = ColumnParallelLinear(up, tp)
        self.down = RowParallelLinear(down, tp)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


def tp_layers(up, down, tp):
    return TensorParallelMLP(up, down, tp)

