"""The input layer: token embedding plus the position encoding, dropout, and optionally a layer
norm (the `seed` preset's model normalises right after embedding)."""
from __future__ import annotations

import torch
from torch import nn

from pygpt.kernels import KernelModule
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.position import position_encoding


class Embeddings(KernelModule):
    def __init__(self, vocab_size: int, dim: int, max_positions: int, *,
                 position: str = "learned", dropout: float = 0.0, norm: bool = False):
        super().__init__()
        self.max_positions = max_positions
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = position_encoding(position, max_positions, dim)
        self.drop = nn.Dropout(dropout)
        self.norm = LayerNorm(dim) if norm else None

    def forward(self, idx: torch.Tensor, start: int = 0) -> torch.Tensor:
        """idx (B, T) token ids at positions start .. start + T - 1 -> (B, T, dim)."""
        T = idx.shape[1]
        if start + T > self.max_positions:
            raise ValueError(f"{start + T} positions exceed the context length "
                             f"{self.max_positions}; slide the window")
        x = self.drop(self.tok(idx) + self.pos(torch.arange(start, start + T, device=idx.device)))
        return self.norm(x) if self.norm is not None else x
