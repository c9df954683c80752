"""The transformer block every family stacks, built from a ModelConfig: attention (causal for
decoders, bidirectional for encoders), the GELU MLP, and the config's norm placement."""
from __future__ import annotations

from pygpt.config import ModelConfig
from pygpt.nn import MLP, Block, MultiHeadAttention


def transformer_block(cfg: ModelConfig, *, causal: bool) -> Block:
    attn = MultiHeadAttention(cfg.n_embd, cfg.n_head, cfg.head_dim, causal=causal,
                              bias=cfg.bias, out_proj=cfg.attn_proj, dropout=cfg.dropout)
    mlp = MLP(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias, dropout=cfg.dropout) if cfg.mlp else None
    return Block(cfg.n_embd, attn, mlp, norm=cfg.norm if cfg.block_norm else "none",
                 residual=cfg.residual)
