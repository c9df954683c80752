"""The transformer blocks every family stacks, built from a ModelConfig: attention (causal for
decoders, bidirectional for encoders; with rotary positions, rotating its queries and keys), the
MLP with the config's activation, and the config's norm placement; and the encoder-decoder's
decoder block, which adds cross-attention over the encoder's output. A block of the GPT or BERT
has its layer's own head count and MLP width (cfg.heads, cfg.mlp_width_of); a decoder block has
n_head and mlp_width (a translator's config holds no per-layer sizes)."""
from __future__ import annotations

from typing import Optional

from pygpt.config import ModelConfig
from pygpt.nn import MLP, Block, MultiHeadAttention, Rotary
from pygpt.nn.decoder_block import DecoderBlock
from pygpt.positions import encoding


def _attention(cfg: ModelConfig, n_head: int, *, causal: bool,
               cross: bool = False) -> MultiHeadAttention:
    """Self-attention (rotary, if the config's positions are) or cross-attention (never)."""
    rotary = (Rotary(cfg.rotary_width, cfg.block_size, cfg.rope_base)
              if encoding(cfg.pos_encoding).rotary and not cross else None)
    return MultiHeadAttention(cfg.n_embd, n_head, cfg.qk_head_dim, causal=causal,
                              bias=cfg.bias, out_proj=cfg.attn_proj, dropout=cfg.dropout,
                              v_head_dim=cfg.v_head_dim, rotary=rotary, cross=cross)


def _mlp(cfg: ModelConfig, width: int) -> Optional[MLP]:
    return (MLP(cfg.n_embd, width, bias=cfg.bias, dropout=cfg.dropout,
                activation=cfg.activation) if cfg.mlp else None)


def transformer_block(cfg: ModelConfig, layer: int, *, causal: bool) -> Block:
    """The block of layer `layer` (0: the first) of a GPT or BERT."""
    return Block(cfg.n_embd, _attention(cfg, cfg.heads(layer), causal=causal),
                 _mlp(cfg, cfg.mlp_width_of(layer)),
                 norm=cfg.norm if cfg.block_norm else "none", residual=cfg.residual,
                 norm_eps=cfg.norm_eps)


def decoder_block(cfg: ModelConfig) -> DecoderBlock:
    return DecoderBlock(cfg.n_embd, _attention(cfg, cfg.n_head, causal=True),
                        _attention(cfg, cfg.n_head, causal=False, cross=True),
                        _mlp(cfg, cfg.mlp_width),
                        norm=cfg.norm if cfg.block_norm else "none", residual=cfg.residual,
                        norm_eps=cfg.norm_eps)
