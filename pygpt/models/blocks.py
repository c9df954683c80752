"""The transformer block every family stacks, built from a ModelConfig: attention (causal for
decoders, bidirectional for encoders; with rotary positions, rotating its queries and keys), the
MLP with the config's activation, and the config's norm placement."""
from __future__ import annotations

from pygpt.config import ModelConfig
from pygpt.nn import MLP, Block, MultiHeadAttention, Rotary


def transformer_block(cfg: ModelConfig, *, causal: bool) -> Block:
    rotary = (Rotary(cfg.rotary_width, cfg.block_size, cfg.rope_base)
              if cfg.pos_encoding == "rotary" else None)
    attn = MultiHeadAttention(cfg.n_embd, cfg.n_head, cfg.head_dim, causal=causal,
                              bias=cfg.bias, out_proj=cfg.attn_proj, dropout=cfg.dropout,
                              rotary=rotary)
    mlp = (MLP(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias, dropout=cfg.dropout,
               activation=cfg.activation) if cfg.mlp else None)
    return Block(cfg.n_embd, attn, mlp, norm=cfg.norm if cfg.block_norm else "none",
                 residual=cfg.residual)
