"""Kind "tp_train" (q18): the digits model (q13's data) trained with the answer's tensor-parallel blocks,
on t ranks, or on a t x p grid: tensor parallelism inside each of p pipeline stages.

Rank g is stage g % p of pipeline g // p, and tensor-parallel rank g // p of its stage: the p ranks of one
pipeline are neighbours (g - 1, g + 1), the t ranks of one stage (s, p + s, 2p + s, ...) its tensor-parallel
group (made here by every rank of the case, in the same order, as q14's grid makes its groups). Stage s
holds blocks s·L/p .. (s+1)·L/p - 1, each the answer's `tp_block` of the unsharded block (with t = 1, the
unsharded block itself: a plain pipeline); the first stage holds the embedding, the last the head,
replicated on the stage's t ranks.

The loop is the single process's (topics/training/single_process.py): AdamW over the rank's parameters (eps: records.py ADAM_EPS), one
optimizer step per batch, cross-entropy of the class scores. With p = 1 a step is one forward and one
backward of the whole batch, as in one process (so the dropout masks are drawn on the whole batch, as the
single process draws them); with p > 1 the batch goes through the stages as `num_microbatches`
micro-batches, all forwards then all backwards, the activations and their gradients sent between
neighbours (the lab's own messages: their bytes counted in `sent_bytes`, the pipeline's traffic), the loss of each the
micro-batch's mean cross-entropy over `num_microbatches` (run those with dropout off: a micro-batch's masks
are not the slices of the whole batch's that one process draws).

While it runs, a collective over ranks outside this rank's tensor-parallel group is refused
(comm/collectives.py: WrongGroup), before it could wait for ranks that never join it. Each rank records the
loss of every step (the last stage's ranks), its LayerNorms' parameters after training, and its events.
With `settings["seed_policy"]` other than "answer" (the notebook's experiment, never graded), the
answer's `dropout.stream` calls are answered by a wrong policy (`POLICIES`): what it does to the curve.

With `settings["perturb"]` (every hidden training case), the ranks of stage 0 change their embedding once
built by noise drawn from a seed the case's rank 0 draws (os.urandom) and hands to the case's ranks through the
launch's store, never through a message of the answer's (pipeline/perturb.py); rank 0 reports the seed. The
judge trains one process with the same change: a curve the answer computed itself from the configuration, and
wrote over the run's, is the unchanged model's, and is told so (judge_train.py).
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from lab_src import exercises
from lab_src.comm import collectives as coll
from lab_src.comm.mesh import Mesh
from lab_src.harness import case_barrier, observe
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline import dropout, perturb, trace, waiting
from lab_src.pipeline.model import build_piece
from lab_src.topics.tensor_parallel import runtime as tpmod
from lab_src.topics.tensor_parallel.kind_block import q17_pieces
from lab_src.topics.tensor_parallel.records import ADAM_EPS, TrainSettings
from lab_src.topics.training import digits
from lab_src.topics.training.classifier import class_scores

DEFAULTS = TrainSettings().to_dict()
# The notebook's experiment (checks/tp_seeds.py): the answer's block, its streams replaced by a wrong policy
POLICIES = {
    "answer": "the answer's own streams",
    "inside_shared": "the masks inside the sharded region drawn from one stream shared by every rank",
    "outside_per_rank": "the replicated region's stream (the LayerNorms' side) seeded per rank",
}


def settings(case: Case) -> dict:
    return settings_of(case).to_dict()


class Stage(torch.nn.Module):
    def __init__(self, cfg, stage: int, p: int, tp):
        super().__init__()
        per = cfg.num_layers // p
        self.embed = build_piece(cfg, "embed", tp.device) if stage == 0 else None
        self.blocks = torch.nn.ModuleList()
        for i in range(stage * per, (stage + 1) * per):
            block = build_piece(cfg, f"blocks.{i}", tp.device)
            self.blocks.append(block if tp.size == 1 else exercises.tp_block(block, tp, q17_pieces()))
        self.head = build_piece(cfg, "head", tp.device) if stage == p - 1 else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return class_scores(self.head(x)) if self.head is not None else x


def _send(tensor, dst: int, group, obs: dict) -> None:
    """The lab's own message to a pipeline neighbour (traced: the deadlock watch sees it), its bytes counted;
    over the case's group (global ranks), which the worker replaces after a failed case: a receive left
    posted by a stopped case must not take the next case's messages."""
    t = tensor.detach().contiguous()
    nbytes = t.numel() * t.element_size()
    obs["sent_bytes"] += nbytes
    with trace.span("send_forward" if dst > dist.get_rank() else "send_backward", None, dst, tuple(t.shape), nbytes):
        waiting.wait(dist.isend(t, dst, group=group))


def _recv(shape, dtype, device, src: int, group) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    with trace.span("recv_forward" if src < dist.get_rank() else "recv_backward", None, src, tuple(shape), 0):
        waiting.wait(dist.irecv(t, src, group=group))
    return t


def train(cfg, s: dict, rank: int, t: int, p: int, tp, group, tracer, obs: dict, perturbed: int | None = None) -> None:
    stage = rank % p
    model = Stage(cfg, stage, p, tp)
    if perturbed is not None and model.embed is not None:
        perturb.perturb_embedding(model.embed, perturbed)   # every replica of stage 0 alike
    model.train()
    obs["params"] = sum(q.numel() for q in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["lr"], eps=ADAM_EPS)     # records.py says why
    data = digits.Digits(cfg)
    m = cfg.num_microbatches if p > 1 else 1
    first, last = stage == 0, stage == p - 1
    act = (cfg.global_batch_size // m, cfg.seq_len, cfg.hidden_size)
    losses, spans = obs["losses"], obs["step_events"]
    for k in range(s["steps"]):
        spans.append(len(tracer.events))
        tokens, labels = data.batch(k)
        tokens, labels = tokens.to(tp.device), labels.to(tp.device)
        optimizer.zero_grad()
        inputs, outputs = [], []
        for j, (tok, lab) in enumerate(zip(tokens.chunk(m), labels.chunk(m))):
            x = tok if first else _recv(act, cfg.torch_dtype, tp.device, rank - 1, group).requires_grad_()
            y = model(x)
            if last:
                y = F.cross_entropy(y, lab) / m
            else:
                _send(y, rank + 1, group, obs)
            inputs.append(x)
            outputs.append(y)
        for j in range(m):
            if last:
                outputs[j].backward()
            else:
                outputs[j].backward(_recv(act, cfg.torch_dtype, tp.device, rank + 1, group))
            if not first:
                _send(inputs[j].grad, rank - 1, group, obs)
        optimizer.step()
        if last:
            losses.append(float(sum(o.detach() for o in outputs)))
    spans.append(len(tracer.events))
    obs["norms"] = {n: q.detach().cpu().clone() for n, q in model.named_parameters() if "norm" in n}


@contextlib.contextmanager
def seed_policy(policy: str, tp_rank: int):
    """Within the block, `dropout.stream` follows `policy` (POLICIES) whatever the answer asks of it."""
    original = dropout.stream

    def wrong(seed, name, shard=None):
        if policy == "inside_shared" and shard is not None:
            return original(seed, name)
        if policy == "outside_per_rank" and shard is None:
            return original(seed + 1000 * (tp_rank + 1), name)
        return original(seed, name, shard)
    if policy != "answer":
        dropout.stream = wrong
    try:
        yield
    finally:
        dropout.stream = original


def run(case: Case, ctx, group, tracer, obs) -> None:
    cfg, s = case.config, settings(case)
    t = s["t"]
    p = case.stages // t
    # rank g is stage g % p and tensor-parallel rank g // p (records.grid_members): a (tp, pp) mesh
    mesh = Mesh.of(case, ctx, whole=group)
    stage, members = mesh.coord("pp"), mesh.members("tp")
    obs.update(losses=[], step_events=[], grid=[t, p], stage=stage, tp_ranks=members, sent_bytes=0)
    finished = False
    mesh.build("tp")    # every rank of the case makes every stage's group, in the same order, as q14's grid does
    tp = tpmod.TensorParallel(mesh.coord("tp"), t, mesh.group("tp"), ctx.device)
    with coll.bounded(members, "the tensor-parallel group", "tp.group"):
        try:
            perturbed = None
            if s.get("perturb"):
                perturbed = int(case_barrier.shared("perturbation", lambda: str(perturb.new_seed())))
                if ctx.rank == 0:
                    obs["perturbed"] = perturbed
            observe.barrier(group)
            with seed_policy(s["seed_policy"], mesh.coord("tp")):
                train(cfg, s, ctx.rank, t, p, tp, group, tracer, obs, perturbed)
            observe.finish_messages(None, group, tracer)
            finished = True
        finally:
            observe.record_instrumentation(obs, tracer)
            if finished:
                mesh.destroy()      # its threads; nothing is in flight on it any more
