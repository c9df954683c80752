"""The input layer: token embedding plus the position encoding (none for the encodings that bias
the attention scores instead, pygpt.nn.position_bias) (plus, for BERT, a segment
embedding telling sentence A from sentence B), then optionally a layer norm (the `seed` preset's
model and BERT normalise right after embedding), then dropout."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from pygpt.kernels import KernelModule
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.position import position_encoding
from pygpt.nn.position_bias import SCORE_BIASES


class Embeddings(KernelModule):
    def __init__(self, vocab_size: int, dim: int, max_positions: int, *,
                 position: str = "learned", dropout: float = 0.0, norm: bool = False,
                 segments: int = 0):
        super().__init__()
        self.max_positions = max_positions
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = (None if position in SCORE_BIASES
                    else position_encoding(position, max_positions, dim))
        self.seg = nn.Embedding(segments, dim) if segments else None
        self.drop = nn.Dropout(dropout)
        self.norm = LayerNorm(dim) if norm else None

    def forward(self, idx: torch.Tensor, start: int = 0,
                segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) token ids at positions start .. start + T - 1, and with segment
        embeddings their segment ids (B, T) (default all 0) -> (B, T, dim)."""
        T = idx.shape[1]
        if start + T > self.max_positions:
            raise ValueError(f"{start + T} positions exceed the context length "
                             f"{self.max_positions}; slide the window")
        x = self.tok(idx)
        if self.pos is not None:
            x = x + self.pos(torch.arange(start, start + T, device=idx.device))
        if self.seg is not None:
            x = x + self.seg(segment_ids if segment_ids is not None else torch.zeros_like(idx))
        elif segment_ids is not None:
            raise ValueError("segment_ids given to embeddings without segments")
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x)
