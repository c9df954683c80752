"""Multi-head attention: self-attention (keys and values from the same sequence) or
cross-attention (from a `context`, such as an encoder's output), causal or not, with separate
W_Q, W_K, W_V and an optional output projection W_O, and, with rotary positions, self-attention's
queries and keys rotated by position. The attention itself is the kernel set's."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from pygpt.kernels import KernelModule
from pygpt.nn.kv_cache import LayerKV
from pygpt.nn.position_bias import ScoreBias
from pygpt.nn.rotary import Rotary


class MultiHeadAttention(KernelModule):
    def __init__(self, dim: int, n_head: int, head_dim: int, *, causal: bool = True,
                 bias: bool = True, out_proj: bool = True, dropout: float = 0.0,
                 context_dim: Optional[int] = None, v_head_dim: Optional[int] = None,
                 rotary: Optional[Rotary] = None):
        """dim: the width of the input (and of the output); context_dim: the width of the
        context keys and values come from in cross-attention (default dim); head_dim: the width
        of one head's queries and keys, v_head_dim that of its values (default head_dim).
        Without out_proj the heads' concatenated values are the output, so n_head * v_head_dim
        must equal dim. rotary: rotates self-attention's queries and keys by their positions
        (never cross-attention's)."""
        super().__init__()
        inner, inner_v = n_head * head_dim, n_head * (v_head_dim or head_dim)
        if not out_proj and inner_v != dim:
            raise ValueError(f"without an output projection the heads ({n_head} x "
                             f"{v_head_dim or head_dim}) must be as wide as the input ({dim})")
        self.n_head, self.head_dim, self.causal = n_head, head_dim, causal
        self.q = nn.Linear(dim, inner, bias=bias)
        self.k = nn.Linear(context_dim or dim, inner, bias=bias)
        self.v = nn.Linear(context_dim or dim, inner_v, bias=bias)
        self.proj = nn.Linear(inner_v, dim, bias=bias) if out_proj else None  # into the residual
        self.dropout = nn.Dropout(dropout)
        self.rotary = rotary

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, T, H * D) -> (B, H, T, D), a strided view (D: the query/key or value width)."""
        B, T, width = t.shape
        return t.view(B, T, self.n_head, width // self.n_head).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None,
                cache: Optional[LayerKV] = None, lengths: Optional[torch.Tensor] = None,
                context_lengths: Optional[torch.Tensor] = None,
                position_bias: Optional[ScoreBias] = None) -> torch.Tensor:
        """x (B, T, dim) -> (B, T, dim). Keys and values come from x (self-attention) or from
        context (cross-attention). With a cache, self-attention appends the new positions' keys
        and values to it and the queries, the last T positions, attend over everything cached
        (causal: bottom-right aligned, as in a decode step); cross-attention fills an empty cache
        from the context once and then reuses it, ignoring later contexts.

        Right-padded batches: lengths (B,) are the real positions of each row of x, and
        context_lengths those of the context (self-attention: the keys are x's, so lengths);
        padded queries give zeros and nothing attends to padding. With a self-attention cache,
        each row's real positions are appended at the row's own end, and the keys each row
        sees are the cache's lengths (rows of different lengths, as in batched generation).
        position_bias: a relative position or ALiBi bias of the scores
        (pygpt.nn.position_bias), applied in the kernel."""
        B, T, _ = x.shape
        q = self._heads(self.q(x))
        kv_lengths = lengths if context is None else context_lengths
        if context is not None and cache is not None and cache.length > 0:
            k, v = cache.k, cache.v
        else:
            source = x if context is None else context
            k, v = self._heads(self.k(source)), self._heads(self.v(source))
            if self.rotary is not None and context is None:  # at the positions after the cache
                q, k = self.rotary(q, k, cache.next_positions if cache is not None else 0)
            if cache is not None and context is None:
                k, v = cache.append(k, v, lengths)
                kv_lengths = cache.lengths
            elif cache is not None:
                k, v = cache.append(k, v)
        bias = position_bias or ScoreBias()
        y = self.kern.attention(q, k, v, causal=self.causal, q_lengths=lengths,
                                kv_lengths=kv_lengths, rel_bias=bias.rel_bias,
                                alibi_slopes=bias.alibi_slopes)
        y = y.transpose(1, 2).reshape(B, T, -1)
        if self.proj is not None:
            y = self.proj(y)
        return self.dropout(y)
