"""The position-wise feed-forward network of a transformer block: widen, a nonlinearity (GELU,
as BERT, its tanh approximation, as GPT-2, or ReLU, as the original Transformer), project back.
With either GELU, the widening and the GELU are the kernel set's linear_gelu: on ours, the bias
and the GELU run as one fused kernel after a bias-free matmul; the parameters are the same
either way."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pygpt.kernels import KernelModule

# The GELUs by activation name, as F.gelu's `approximate` argument names them.
GELU_APPROXIMATIONS = {"gelu": "none", "gelu_tanh": "tanh"}
ACTIVATIONS = (*GELU_APPROXIMATIONS, "relu")


class MLP(KernelModule):
    def __init__(self, dim: int, hidden: int, *, bias: bool = True, dropout: float = 0.0,
                 activation: str = "gelu"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose from "
                             f"{', '.join(ACTIVATIONS)}")
        self.fc = nn.Linear(dim, hidden, bias=bias)
        # F.gelu's approximate ("none" or "tanh") for a GELU, None for ReLU.
        self.approximate = GELU_APPROXIMATIONS.get(activation)
        self.proj = nn.Linear(hidden, dim, bias=bias)  # writes into the residual stream
        self.dropout = nn.Dropout(dropout)

    @property
    def gelu(self) -> bool:
        """Whether the nonlinearity is a GELU (exact or tanh), fused with the widening's bias."""
        return self.approximate is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.approximate is not None:
            h = self.kern.linear_gelu(x, self.fc.weight, self.fc.bias, self.approximate)
        else:
            h = F.relu(self.fc(x))
        y = self.proj(h)
        return self.dropout(y) if self.training else y  # no module call per decode step
