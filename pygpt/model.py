"""The GPT: token embedding plus positions, a stack of pre-norm transformer blocks, a final layer
norm and the LM head. Attention, every layer norm and the loss run on a chosen set of kernels:
ours (`ext`, default) or plain PyTorch (`torch`), the reference path that must agree with ours.

Initialisation (nanoGPT's, which follows GPT-2): linear and position weights ~ N(0, 0.02), biases
zero, the projections that write into the residual stream (W_O, the MLP's output) ~
N(0, 0.02 / sqrt(2 * n_layer)) so the stream's variance does not grow with depth, token
embeddings ~ N(0, embed_std) (0.02; the `seed` preset uses 1), layer norms at identity.
"""
from __future__ import annotations

import math
from typing import Iterator, NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from pygpt.config import ModelConfig
from pygpt.kernels import Kernels, kernels as kernels_named

# Per layer, the keys and values of the positions seen so far: two (B, n_head, T_past, head_dim).
KVCache = list[tuple[torch.Tensor, torch.Tensor]]


class GPTOutput(NamedTuple):
    logits: torch.Tensor  # (B, T, vocab_size)
    loss: Optional[torch.Tensor]  # mean next-token cross-entropy, when targets are given
    present: Optional[KVCache]  # the cache extended by this call's positions, when asked for


def sinusoidal_positions(n_pos: int, dim: int) -> torch.Tensor:
    """The fixed encoding of "Attention Is All You Need": sin on even, cos on odd channels."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


class LayerNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor, kern: Kernels) -> torch.Tensor:
        return kern.layer_norm(x, self.weight, self.bias)


class SelfAttention(nn.Module):
    """Causal multi-head attention with separate W_Q, W_K, W_V and an optional W_O."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.n_embd // cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias) if cfg.attn_proj else None
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, kern: Kernels,
                past: Optional[tuple[torch.Tensor, torch.Tensor]]):
        B, T, C = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, C) -> (B, H, T, D), a strided view
            return t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        # Causal with the queries as the last T positions, so a decode step over a cache is right.
        y = kern.attention(q, k, v, causal=True).transpose(1, 2).reshape(B, T, C)
        if self.proj is not None:
            y = self.proj(y)
        return self.dropout(y), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """x + attn(norm(x)), then x + mlp(norm(x)); norms, residuals and the MLP are switchable."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.residual = cfg.residual
        self.attn_norm = LayerNorm(cfg.n_embd) if cfg.block_norm else None
        self.attn = SelfAttention(cfg)
        self.mlp_norm = LayerNorm(cfg.n_embd) if cfg.block_norm and cfg.mlp else None
        self.mlp = MLP(cfg) if cfg.mlp else None

    def forward(self, x: torch.Tensor, kern: Kernels,
                past: Optional[tuple[torch.Tensor, torch.Tensor]]):
        h = self.attn_norm(x, kern) if self.attn_norm is not None else x
        a, present = self.attn(h, kern, past)
        x = x + a if self.residual else a
        if self.mlp is not None:
            h = self.mlp_norm(x, kern) if self.mlp_norm is not None else x
            m = self.mlp(h)
            x = x + m if self.residual else m
        return x, present


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: str = "ext"):
        super().__init__()
        self.config = cfg
        self.kernels = kernels  # the name; see the property setter below
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos_encoding == "learned":
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        else:
            self.pos_emb = None
            self.register_buffer("pos_table", sinusoidal_positions(cfg.block_size, cfg.n_embd),
                                 persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.embed_norm = LayerNorm(cfg.n_embd) if cfg.embed_norm else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.final_norm = LayerNorm(cfg.n_embd) if cfg.final_norm else None
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        self._init_weights()

    @property
    def kernels(self) -> str:
        return self._kernels_name

    @kernels.setter
    def kernels(self, name: str) -> None:
        self._kern = kernels_named(name)
        self._kernels_name = name

    def _init_weights(self) -> None:
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, 0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for block in self.blocks:
            for proj in (block.attn.proj, block.mlp.proj if block.mlp is not None else None):
                if proj is not None:
                    nn.init.normal_(proj.weight, 0.0, residual_std)
        if self.pos_emb is not None:
            nn.init.normal_(self.pos_emb.weight, 0.0, 0.02)
        # Last, as a tied LM head shares this tensor.
        nn.init.normal_(self.tok_emb.weight, 0.0, self.config.embed_std)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None,
                past: Optional[KVCache] = None, use_cache: bool = False) -> GPTOutput:
        """idx (B, T) token ids at positions past_len .. past_len + T - 1, where past_len is the
        length of `past` (0 without). Returns logits for every position, the loss against targets
        (B, T) if given, and with `use_cache` the cache extended by these T positions."""
        if idx.dim() != 2:
            raise ValueError(f"idx must be (batch, time), got shape {tuple(idx.shape)}")
        B, T = idx.shape
        start = past[0][0].shape[2] if past else 0
        if start + T > self.config.block_size:
            raise ValueError(f"{start + T} positions exceed the context length "
                             f"{self.config.block_size}; slide the window")
        if past is not None and len(past) != len(self.blocks):
            raise ValueError(f"past has {len(past)} layers, the model {len(self.blocks)}")
        kern = self._kern
        pos = torch.arange(start, start + T, device=idx.device)
        pos_vec = self.pos_emb(pos) if self.pos_emb is not None else self.pos_table[pos]
        x = self.drop(self.tok_emb(idx) + pos_vec)
        if self.embed_norm is not None:
            x = self.embed_norm(x, kern)
        present: KVCache = []
        for i, block in enumerate(self.blocks):
            x, layer_kv = block(x, kern, past[i] if past else None)
            present.append(layer_kv)
        if self.final_norm is not None:
            x = self.final_norm(x, kern)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = kern.cross_entropy(logits.view(B * T, -1), targets.reshape(B * T))
        return GPTOutput(logits, loss, present if use_cache else None)

    @torch.inference_mode()  # unlike no_grad, skips the autograd layer of our ops entirely
    def stream(self, idx: torch.Tensor, max_new_tokens: int, **options) -> Iterator[torch.Tensor]:
        """Yields each new token (B,) as it is chosen; options as pygpt.generation.stream."""
        from pygpt.generation import stream

        yield from stream(self, idx, max_new_tokens, **options)

    @torch.inference_mode()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
        """idx (B, T) extended by max_new_tokens sampled tokens: (B, T + max_new_tokens)."""
        new = list(self.stream(idx, max_new_tokens, **options))
        return torch.cat([idx, torch.stack(new, dim=1)], dim=1) if new else idx
