"""The position-wise feed-forward network of a transformer block: widen, a nonlinearity (GELU,
as GPT-2 and BERT, or ReLU, as the original Transformer), project back."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0,
                 activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from "
                             f"{', '.join(ACTIVATIONS)}")
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.proj = nn.Linear(hidden, dim, bias=bias)  # writes into the residual stream
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(self.act(self.fc(x))))
