"""Position encodings added to the token embeddings (attention alone is blind to order):
learned absolute embeddings, or the fixed sinusoids of "Attention Is All You Need". Each maps
position ids (T,) to vectors (T, dim)."""
from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(n_pos: int, dim: int) -> torch.Tensor:
    """(n_pos, dim) float32: sin on even channels, cos on odd, at geometric frequencies."""
    pos = torch.arange(n_pos, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    table = torch.zeros(n_pos, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table.float()


class LearnedPositions(nn.Embedding):
    """One learned vector per position."""


class SinusoidalPositions(nn.Module):
    """The fixed table, computed once (a buffer, not saved with the weights)."""

    def __init__(self, n_pos: int, dim: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(n_pos, dim), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.table[positions]


POSITION_ENCODINGS = {"learned": LearnedPositions, "sinusoidal": SinusoidalPositions}


def position_encoding(kind: str, n_pos: int, dim: int) -> nn.Module:
    if kind not in POSITION_ENCODINGS:
        raise ValueError(f"unknown position encoding {kind!r}; choose from "
                         f"{', '.join(POSITION_ENCODINGS)}")
    return POSITION_ENCODINGS[kind](n_pos, dim)
