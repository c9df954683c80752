"""The position-wise feed-forward network of a transformer block: widen, a nonlinearity (GELU,
as GPT-2 and BERT, or ReLU, as the original Transformer), project back. With GELU, the widening
and the GELU are the kernel set's linear_gelu: on ours, the bias and the GELU run as one fused
kernel after a bias-free matmul; the parameters are the same either way."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pygpt.kernels import KernelModule

ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}


class MLP(KernelModule):
    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0,
                 activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from "
                             f"{', '.join(ACTIVATIONS)}")
        self.fc = nn.Linear(dim, hidden, bias=bias)
        self.act = ACTIVATIONS[activation]
        self.gelu = activation == "gelu"
        self.proj = nn.Linear(hidden, dim, bias=bias)  # writes into the residual stream
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gelu:
            h = self.kern.linear_gelu(x, self.fc.weight, self.fc.bias)
        else:
            h = self.act(self.fc(x))
        y = self.proj(h)
        return self.dropout(y) if self.training else y  # no module call per decode step
