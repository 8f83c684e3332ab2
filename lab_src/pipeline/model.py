"""A tiny decoder-style transformer, built one piece at a time.

    tokens (batch, seq) -> embed -> blocks[0] ... blocks[L-1] -> norm -> head -> logits (batch, seq, vocab)

Every piece is initialised from its own seed, derived from the run seed and the piece's name. So a
pipeline stage that builds only `blocks.4` and `blocks.5` gets exactly the weights those blocks have
in the full model, without ever building the rest: the stage and the unsharded baseline agree
parameter for parameter, and parameter names (``blocks.5.mlp.up.weight``) are the same in both.

With `cfg.tie_embeddings` the head's output projection reuses the token embedding's weight (a (vocab,
hidden) matrix either way). The whole model shares one parameter between the two uses; a pipeline's last
stage, which never builds the embedding, gets a copy drawn from the embedding's own seed, so the copies
start equal (q14). Off, nothing changes: the head draws its own projection as before.

The module keeps a per-process record of which pieces were built and how often each ran forward.
The checks read it to prove that a pipeline rank holds and runs only its own layers.
"""
from __future__ import annotations

import hashlib
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

from lab_src.pipeline import dropout
from lab_src.pipeline.config import TIED_NAMES, LabConfig  # noqa: F401 - TIED_NAMES: the model's fact, read here too

# Per-process instrumentation: the names of pieces built, and forward calls per piece.
BUILT: list[str] = []
RAN: Counter = Counter()


def reset_instrumentation() -> None:
    BUILT.clear()
    RAN.clear()


def piece_seed(seed: int, name: str) -> int:
    """The seed of one piece: the same on every rank that builds it, different for every piece."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


class Embedding(nn.Module):
    """Token plus learned position embedding. Lives on the first stage."""

    name = "embed"

    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = nn.Embedding(cfg.seq_len, cfg.hidden_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        RAN[self.name] += 1
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tokens(tokens) + self.positions(positions)


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention, then an MLP, each with a residual."""

    def __init__(self, cfg: LabConfig, index: int):
        super().__init__()
        self.name = f"blocks.{index}"
        self.num_heads = cfg.num_heads
        h = cfg.hidden_size
        self.attn_norm = nn.LayerNorm(h)
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.mlp_norm = nn.LayerNorm(h)
        self.up = nn.Linear(h, 4 * h)
        self.down = nn.Linear(4 * h, h)
        # dropout (q18, pipeline/dropout.py): off unless cfg.dropout > 0, and then only in training mode
        self.seed, self.dropout, self.dropout_shards = cfg.seed, cfg.dropout, cfg.dropout_shards
        self.streams = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RAN[self.name] += 1
        if self.dropout > 0 and self.training:
            return self._forward_dropping(x)
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, h))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))

    def _forward_dropping(self, x: torch.Tensor) -> torch.Tensor:
        """The forward with dropout, its masks drawn as pipeline/dropout.py defines them."""
        if self.streams is None:
            self.streams = dropout.Streams(self.seed, self.name, self.dropout_shards)
        p = self.dropout
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.num_heads, h // self.num_heads).transpose(1, 2) for t in (q, k, v))
        attn = dropout.attention(q, k, v, self.streams.attention_mask((b, self.num_heads, s, s), p, x))
        a = self.proj(attn.transpose(1, 2).reshape(b, s, h))
        x = x + a * dropout.keep(self.streams.shared, a.shape, p, a)
        m = self.down(F.gelu(self.up(self.mlp_norm(x))))
        return x + m * dropout.keep(self.streams.shared, m.shape, p, m)


class Head(nn.Module):
    """Final norm and projection to the vocabulary. Lives on the last stage."""

    name = "head"

    def __init__(self, cfg: LabConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        RAN[self.name] += 1
        return self.proj(self.norm(x))


def build_piece(cfg: LabConfig, name: str, device="cpu") -> nn.Module:
    """Build one named piece ("embed", "blocks.<i>" or "head") from its own seed.

    Pieces are created on the CPU in float32 and then moved, so that a CUDA rank and a CPU rank,
    or a float64 run and a float32 run, start from the same numbers.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(piece_seed(cfg.seed, name))
        if name == "embed":
            piece = Embedding(cfg)
        elif name == "head":
            piece = Head(cfg)
        elif name.startswith("blocks."):
            index = int(name.split(".")[1])
            if not 0 <= index < cfg.num_layers:
                raise ValueError(f"there is no block {index}: the model has blocks 0..{cfg.num_layers - 1}")
            piece = Block(cfg, index)
        else:
            raise ValueError(f"unknown model piece {name!r}")
        if name == "head" and cfg.tie_embeddings:
            piece.proj.weight = nn.Parameter(tied_embedding_weight(cfg))
    BUILT.append(name)
    return piece.to(device=device, dtype=cfg.torch_dtype)


def tied_embedding_weight(cfg: LabConfig) -> torch.Tensor:
    """The token embedding's initial weight, drawn as the embedding draws it (its own seed, first draw):
    what the last stage's copy of a tied embedding starts from."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(piece_seed(cfg.seed, "embed"))
        return nn.Embedding(cfg.vocab_size, cfg.hidden_size).weight.detach().clone()


class TinyDecoder(nn.Module):
    """The whole, unsharded model: what the baseline runs."""

    def __init__(self, cfg: LabConfig, device="cpu"):
        super().__init__()
        self.embed = build_piece(cfg, "embed", device)
        self.blocks = nn.ModuleList(build_piece(cfg, f"blocks.{i}", device) for i in range(cfg.num_layers))
        self.head = build_piece(cfg, "head", device)
        if cfg.tie_embeddings:      # one parameter, used twice: its gradient is the sum of both uses
            self.head.proj.weight = self.embed.tokens.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model(cfg: LabConfig, device="cpu") -> TinyDecoder:
    return TinyDecoder(cfg, device)
