"""One layer of an encoder-decoder's decoder: causal self-attention over the target, then
cross-attention from the target to the encoder's output (the "memory"), then an optional MLP;
each a sub-layer with a residual connection and the layer norm placement of Block (pre or post).

DecoderCache is what incremental decoding keeps per decoder layer: the self-attention keys and
values of the target positions so far, and the cross-attention ones of the memory, computed
from it on the first step and reused after. Beam search reorders its rows.
"""
from __future__ import annotations

from typing import Optional

import torch

from pygpt.nn.attention import MultiHeadAttention
from pygpt.nn.block import Block, NormPlacement
from pygpt.nn.kv_cache import KVCache, LayerKV
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.mlp import MLP
from pygpt.nn.position_bias import ScoreBias


class DecoderCache:
    """Per decoder layer, a LayerKV for self-attention and one for cross-attention; the rows
    (batch dim) are the sentences (or hypotheses) being decoded."""

    def __init__(self, n_layer: int):
        self.self_attn, self.cross_attn = KVCache(n_layer), KVCache(n_layer)

    def __len__(self) -> int:
        """The number of layers."""
        return len(self.self_attn)

    @property
    def length(self) -> int:
        """Target positions decoded so far (where the next ones start)."""
        return self.self_attn.length

    def layer(self, i: int) -> tuple[LayerKV, LayerKV]:
        return self.self_attn[i], self.cross_attn[i]

    def select(self, rows: torch.Tensor, cross: bool = True) -> None:
        """Keeps, in this order, the given rows (int64 indices into the batch dim; repeats allowed)
        of every self-attention LayerKV and, with cross, of every cross-attention one. Beam search
        passes cross=False when each row keeps its sentence, whose memory keys and values are
        then already in place."""
        caches = (self.self_attn, self.cross_attn) if cross else (self.self_attn,)
        for cache in caches:
            for layer in cache.layers:
                if layer.k is not None:
                    layer.k, layer.v = layer.k.index_select(0, rows), layer.v.index_select(0, rows)


class DecoderBlock(Block):
    """Block's self-attention and MLP sub-layers with cross-attention between them."""

    def __init__(self, dim: int, self_attn: MultiHeadAttention, cross_attn: MultiHeadAttention,
                 mlp: Optional[MLP] = None, *, norm: NormPlacement = "pre",
                 residual: bool = True, norm_eps: float = 1e-5):
        if self_attn.causal is not True or cross_attn.causal is not False:
            raise ValueError("a decoder block needs causal self-attention and non-causal "
                             "cross-attention")
        super().__init__(dim, self_attn, mlp, norm=norm, residual=residual, norm_eps=norm_eps)
        self.cross_norm = LayerNorm(dim, norm_eps) if norm != "none" else None
        self.cross = cross_attn

    def forward(self, x: torch.Tensor, memory: torch.Tensor,
                memory_lengths: Optional[torch.Tensor] = None,
                cache: Optional[tuple[LayerKV, LayerKV]] = None,
                lengths: Optional[torch.Tensor] = None,
                position_bias: Optional[ScoreBias] = None) -> torch.Tensor:
        """x (B, T, dim) the target; memory (B, S, dim) the encoder's output, memory_lengths (B,)
        its real positions (None: all S). lengths (B,): x's real positions in a right-padded
        batch (not with a cache, whose rows are unpadded). cache: this layer's (self-attention,
        cross-attention) LayerKVs; the first extends by x's positions, the second is filled from
        memory when empty and otherwise used as it is. position_bias: the decoder's relative or
        ALiBi score bias, for self-attention only."""
        self_cache, cross_cache = cache if cache is not None else (None, None)
        sublayers = [
            (self.attn_norm, lambda h: self.attn(h, cache=self_cache, lengths=lengths,
                                                 position_bias=position_bias)),
            (self.cross_norm, lambda h: self.cross(h, context=memory, cache=cross_cache,
                                                   lengths=lengths,
                                                   context_lengths=memory_lengths)),
        ]
        if self.mlp is not None:
            sublayers.append((self.mlp_norm, self.mlp))
        return self._sublayers(x, sublayers)
