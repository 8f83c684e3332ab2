"""Kind "sp_train" (q23's third answer): the digits model (q13's data) trained with the answer's `sp_block` on the
case's t ranks, against one process's curve (judge_sp.py `sp_training`).

Every rank holds the whole embedding and head (replicated) and the answer's sequence-parallel part of every block.
A step: the embedding of the whole batch, this rank's positions of it (the lab's cut), the blocks, the positions
put back together (the lab's all-gather, its backward this rank's slice of the gradient), the head and the loss, the
same on every rank. The embedding's gradient comes from this rank's positions only: the lab sums it over the group
(the lab's own all-reduce, unrecorded), as one process's would be; the head's is whole on every rank. What the
answer must sum itself, the blocks' replicated gradients, it sums in its backward (else the replicas drift apart and
the curve leaves one process's). AdamW with q18's eps (shards.py ADAM_EPS), dropout as the
configuration says, its attention masks drawn per shard of t (pipeline/dropout.py).

With `perturb` (the hidden case), the embedding is changed once built by noise from a seed rank 0 draws outside the
answer and hands the ranks through the launch's store (pipeline/perturb.py); rank 0 reports it, and the judge
trains one process with the same change.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import case_barrier, observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import perturb
from lab_src.pipeline.model import build_piece
from lab_src.topics.long_sequences.kind_sp import sp_function
from lab_src.topics.long_sequences.records import SP_REPLICATED
from lab_src.topics.long_sequences import shards as tpmod
from lab_src.topics.long_sequences.shards import ADAM_EPS
from lab_src.topics.training import digits
from lab_src.topics.training.classifier import class_scores


class _Gathered(torch.autograd.Function):
    """The lab's: the ranks' positions put back in sequence order; backward, this rank's slice of the gradient
    (the loss after it is the same on every rank)."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp, ctx.n = tp, x.shape[1]
        pieces = [torch.empty_like(x) for _ in range(tp.size)]
        coll.lab("all_gather")(pieces, x.contiguous(), group=tp.group)
        return torch.cat(pieces, dim=1)

    @staticmethod
    def backward(ctx, grad):
        r, n = ctx.tp.rank, ctx.n
        return grad[:, r * n:(r + 1) * n], None


class Model(torch.nn.Module):
    def __init__(self, cfg, tp):
        super().__init__()
        self.tp = tp
        self.embed = build_piece(cfg, "embed", tp.device)
        self.blocks = torch.nn.ModuleList(sp_function()(build_piece(cfg, f"blocks.{i}", tp.device), tp)
                                          for i in range(cfg.num_layers))
        self.head = build_piece(cfg, "head", tp.device)

    def forward(self, tokens):
        x = self.embed(tokens).chunk(self.tp.size, dim=1)[self.tp.rank]
        for block in self.blocks:
            x = block(x)
        return class_scores(self.head(_Gathered.apply(x, self.tp)))


def train(cfg, s, tp, obs: dict, perturbed: int | None) -> None:
    model = Model(cfg, tp)
    if perturbed is not None:
        perturb.perturb_embedding(model.embed, perturbed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=s.lr, eps=ADAM_EPS)
    data = digits.Digits(cfg)
    reduce = coll.lab("all_reduce")
    for k in range(s.steps):
        tokens, labels = (t.to(tp.device) for t in data.batch(k))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        for q in model.embed.parameters():
            if q.grad is not None:
                reduce(q.grad, group=tp.group)
        optimizer.step()
        obs["losses"].append(float(loss.detach()))
    obs["norms"] = {f"blocks.{i}.{n}": q.detach().cpu().clone() for i, block in enumerate(model.blocks)
                    for n, q in block.named_parameters() if n in SP_REPLICATED}


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, s = case.config, settings_of(case)
    mesh = Mesh.of(case, ctx, whole=group).build("tp")
    tp = tpmod.TensorParallel(mesh.coord("tp"), case.stages, mesh.group("tp"), ctx.device)
    obs.update(losses=[])
    finished = False
    with coll.bounded(mesh.members("tp"), "the tensor-parallel group", "tp.group"):
        try:
            perturbed = None
            if s.perturb:
                perturbed = int(case_barrier.shared("perturbation", lambda: str(perturb.new_seed())))
                if ctx.rank == 0:
                    obs["perturbed"] = perturbed
            observe.barrier(group)
            train(cfg, s, tp, obs, perturbed)
            observe.finish_messages(None, group, tracer)
            finished = True
        finally:
            observe.record_instrumentation(obs, tracer)
            if finished:
                mesh.destroy()
