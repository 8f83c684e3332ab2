"""The lab's mixture-of-experts model and one process's MoE (what q25's ranks run the answer in, and what the judge
compares them with). The routing rule is not here: it is q25's `route`, and the student package holds no answer. The
grader brings its own rule (grader/hidden/q25_dispatch.py); the visible check uses the answer's route once it has
shown the rule's properties on the run's own inputs (judge.py routing_properties).

    model = MoeModel(cfg, experts=4, owned=[2, 3])      the lab's decoder, each block's MLP replaced by a router and E
                                                        experts (only `owned` built); every piece from its own seed
    logits = model(tokens, moe)                         moe(block, index, x (T, h)) -> (T, h): the experts' part of a
                                                        block, added to its residual
    routing = route(x, router, k, capacity_factor)      a rule (q25's contract): Routing(experts, weights, keep, E)
    y = one_process_moe(block, x, routing)              every expert in this process: sum of the kept weights * outputs
    tokens, targets = batch(cfg, settings, step, rank)  the rank's rows of one step's batch

Pieces keep the lab's names and seeds (pipeline/model.py): block i's attention is exactly the lab's block i's; its
router is drawn from the seed of "blocks.i.router", expert e from "blocks.i.experts.e", so every rank that builds
expert e builds the same one. The model is built in float32 and moved to the case's dtype, as the lab's pieces are.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lab_src.pipeline.model import build_piece, piece_seed
from lab_src.topics.experts.records import STARVED_BIAS

DTYPES = {"float32": torch.float32, "float64": torch.float64}


class Routing(NamedTuple):
    """What route returns: per token (T rows) its k experts, their weights and whether each assignment is kept."""
    experts: torch.Tensor       # (T, k) long, each token's choices, first choice first
    weights: torch.Tensor       # (T, k) the router's probabilities of those experts (softmax over all E, not renormalised)
    keep: torch.Tensor          # (T, k) bool, False where the expert was full
    num_experts: int            # E


class Expert(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.up = nn.Linear(h, 2 * h)
        self.down = nn.Linear(2 * h, h)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))            # an MLP as the lab's blocks have, 2h wide


def _seeded(seed: int, name: str, make):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(piece_seed(seed, name))
        return make()


class MoeBlock(nn.Module):
    """The lab's block i (its attention exactly) with the MLP replaced by a router and the experts this rank holds."""

    def __init__(self, cfg, index: int, experts: int, owned, starved=()):
        super().__init__()
        lab = build_piece(cfg, f"blocks.{index}")
        self.name, self.num_heads = lab.name, lab.num_heads
        self.attn_norm, self.qkv, self.proj, self.mlp_norm = lab.attn_norm, lab.qkv, lab.proj, lab.mlp_norm
        h = cfg.hidden_size
        self.router = _seeded(cfg.seed, f"{self.name}.router", lambda: nn.Linear(h, experts))
        if starved:
            with torch.no_grad():
                self.router.bias[list(starved)] = STARVED_BIAS
        self.experts = nn.ModuleDict({str(e): _seeded(cfg.seed, f"{self.name}.experts.{e}", lambda: Expert(h))
                                      for e in owned})

    def forward(self, x, moe, index: int):
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + moe(self, index, self.mlp_norm(x).reshape(b * s, h)).reshape(b, s, h)


class MoeModel(nn.Module):
    def __init__(self, cfg, experts: int, owned, dtype: str = "float64", starved=()):
        super().__init__()
        self.embed = build_piece(cfg, "embed")
        self.blocks = nn.ModuleList(MoeBlock(cfg, i, experts, owned, starved) for i in range(cfg.num_layers))
        self.head = build_piece(cfg, "head")
        self.to(DTYPES[dtype])

    def forward(self, tokens, moe):
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            x = block(x, moe, i)
        return self.head(x)

    def expert_parameters(self) -> list:
        return [p for n, p in self.named_parameters() if ".experts." in n]

    def dense_parameters(self) -> list:
        return [p for n, p in self.named_parameters() if ".experts." not in n]


def starved_experts(settings) -> list[int]:
    """The experts of the last ep rank where the case starves it, else none."""
    if not settings.starve:
        return []
    per = settings.experts // settings.ep
    return list(range(settings.experts - per, settings.experts))


def one_process_moe(block, x, routing: Routing, weighted: bool = True):
    """Every expert in this process: out[t] = sum over t's kept assignments of weight * expert(x[t])."""
    out = torch.zeros_like(x)
    tok = torch.arange(x.shape[0]).unsqueeze(1).expand_as(routing.experts)
    for e in range(routing.num_experts):
        mask = (routing.experts == e) & routing.keep
        rows, w = tok[mask], routing.weights[mask]
        y = block.experts[str(e)](x[rows])
        out = out.index_add(0, rows, (w.unsqueeze(1) * y) if weighted else y)
    return out


def batch(cfg, settings, step: int, rank: int | None = None, ranks: int = 1):
    """(tokens, targets) of one step: `ranks` * batch sequences (rank None: all of them; else that rank's rows)."""
    g = torch.Generator().manual_seed(piece_seed(cfg.seed, f"moe.batch.{step}"))
    rows = settings.batch * ranks
    data = torch.randint(cfg.vocab_size, (rows, cfg.seq_len + 1), generator=g)
    if rank is not None:
        data = data[rank * settings.batch:(rank + 1) * settings.batch]
    return data[:, :-1], data[:, 1:]


def loss_of(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def one_process_run(cfg, settings, ranks: int, route) -> dict:
    """One process, every expert, the whole batch of every rank: per step the mean loss over every rank's tokens (the
    ranks' mean, as their tokens are equal in number), step 0's logits and each layer's routing and MoE output per rank,
    and step 0's gradients of the mean. Each rank's tokens are routed as that rank routes them (capacity per source
    rank), which is all that distinguishes them from one batch. `route` is the rule: route(x, router, k,
    capacity_factor) -> Routing."""
    model = MoeModel(cfg, settings.experts, range(settings.experts), settings.dtype, starved_experts(settings))
    T = settings.batch * cfg.seq_len
    out = {"losses": [], "layers": [], "logits": None, "grads": {}}

    def moe(block, index, x):
        ys = []
        for r in range(ranks):
            xr = x[r * T:(r + 1) * T]
            routing = route(xr, block.router, settings.k, settings.capacity_factor)
            y = one_process_moe(block, xr, routing)
            if record:
                out["layers"].append({"rank": r, "layer": index, "routing": routing._replace(
                    weights=routing.weights.detach()), "combined": y.detach(), "x": xr.detach()})
            ys.append(y)
        return torch.cat(ys)
    for step in range(settings.steps):
        record = step == 0
        tokens, targets = batch(cfg, settings, step, None, ranks)
        logits = model(tokens, moe)
        loss = loss_of(logits, targets)
        out["losses"].append(loss.item())
        model.zero_grad()
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach()
            out["grads"] = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
                            for n, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= settings.lr * p.grad
    return out
