"""The transformer blocks every family stacks, built from a ModelConfig: attention (causal for
decoders, bidirectional for encoders), the GELU MLP, and the config's norm placement; and the
encoder-decoder's decoder block, which adds cross-attention over the encoder's output."""
from __future__ import annotations

from typing import Optional

from pygpt.config import ModelConfig
from pygpt.nn import MLP, Block, MultiHeadAttention
from pygpt.nn.decoder_block import DecoderBlock


def _attention(cfg: ModelConfig, *, causal: bool) -> MultiHeadAttention:
    return MultiHeadAttention(cfg.n_embd, cfg.n_head, cfg.qk_head_dim, causal=causal,
                              bias=cfg.bias, out_proj=cfg.attn_proj, dropout=cfg.dropout,
                              v_head_dim=cfg.v_head_dim)


def _mlp(cfg: ModelConfig) -> Optional[MLP]:
    return MLP(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias, dropout=cfg.dropout) if cfg.mlp else None


def transformer_block(cfg: ModelConfig, *, causal: bool) -> Block:
    return Block(cfg.n_embd, _attention(cfg, causal=causal), _mlp(cfg),
                 norm=cfg.norm if cfg.block_norm else "none", residual=cfg.residual)


def decoder_block(cfg: ModelConfig) -> DecoderBlock:
    return DecoderBlock(cfg.n_embd, _attention(cfg, causal=True), _attention(cfg, causal=False),
                        _mlp(cfg), norm=cfg.norm if cfg.block_norm else "none",
                        residual=cfg.residual)
