"""Layer normalisation over the last dimension, with a learned scale and shift; optionally of a
residual add, fused with it."""
from __future__ import annotations

import torch
from torch import nn

from pygpt.kernels import KernelModule


class LayerNorm(KernelModule):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kern.layer_norm(x, self.weight, self.bias, self.eps)

    def add_norm(self, x: torch.Tensor,
                 residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it): a residual add and the norm after it as one kernel
        (the kernel set's add_layer_norm)."""
        return self.kern.add_layer_norm(x, residual, self.weight, self.bias, self.eps)
