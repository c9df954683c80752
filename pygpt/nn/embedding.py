"""The input layer: token embedding plus the position encoding (plus, for BERT, a segment
embedding telling sentence A from sentence B), then optionally a layer norm (the `seed` preset's
model and BERT normalise right after embedding), then dropout. The encodings that act inside
attention instead (pygpt.positions: no `embedding` part) add nothing here."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from pygpt.kernels import KernelModule
from pygpt.nn.kv_cache import Positions, position_ids
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.position import position_encoding
from pygpt.positions import encoding


class Embeddings(KernelModule):
    def __init__(self, vocab_size: int, dim: int, max_positions: int, *,
                 position: str = "learned", dropout: float = 0.0, norm: bool = False,
                 segments: int = 0, norm_eps: float = 1e-5):
        super().__init__()
        self.max_positions = max_positions
        self.tok = nn.Embedding(vocab_size, dim)
        added = encoding(position).embedding
        self.pos = None if added is None else position_encoding(added, max_positions, dim)
        self.seg = nn.Embedding(segments, dim) if segments else None
        self.drop = nn.Dropout(dropout)
        self.norm = LayerNorm(dim, norm_eps) if norm else None

    def forward(self, idx: torch.Tensor, start: Positions = 0,
                segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """idx (B, T) token ids at positions start .. start + T - 1 (start: an int, or one per
        row (B,), as for rows of a cache at different positions), and with segment embeddings
        their segment ids (B, T) (default all 0) -> (B, T, dim)."""
        T = idx.shape[1]
        x = self.tok(idx)
        if self.pos is not None:
            positions, end = position_ids(start, T, idx.device)
            if end is not None and end > self.max_positions:
                raise ValueError(f"{end} positions exceed the context length "
                                 f"{self.max_positions}; slide the window")
            x = x + self.pos(positions)
        if self.seg is not None:
            x = x + self.seg(segment_ids if segment_ids is not None else torch.zeros_like(idx))
        elif segment_ids is not None:
            raise ValueError("segment_ids given to embeddings without segments")
        if self.norm is not None:
            x = self.norm(x)
        return self.drop(x) if self.training else x  # eval: skip the no-op call (decoding)
