"""Rotary position embedding (RoPE, Su et al. 2021, in the half-split layout of GPT-NeoX and
LLaMA): instead of adding a position vector to the tokens, every self-attention layer rotates
its queries and keys, pair of channels by pair, by angles proportional to their positions, so
that a query-key score depends on the two positions only through their difference. Cached keys
keep the angles of their absolute positions, which is why a KV cache can roll past the context
length without recomputing them."""
from __future__ import annotations

import torch

from pygpt.kernels import KernelModule
from pygpt.nn.kv_cache import Positions, position_ids


def rotary_tables(n_pos: int, rotary_dim: int, base: float = 10000.0,
                  dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of p * base^(-2i / rotary_dim) for positions p < n_pos and pairs
    i < rotary_dim / 2: two (n_pos, rotary_dim / 2) tables of dtype, computed in float64 so that
    large positions keep their precision."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


class Rotary(KernelModule):
    """Rotates one attention layer's queries and keys on the kernel set's rotary op. The tables
    (buffers, not saved with the weights: they follow from rotary_dim and base) cover n_pos
    positions and grow when later positions come (a rolling KV cache)."""

    def __init__(self, rotary_dim: int, n_pos: int, base: float = 10000.0):
        super().__init__()
        if rotary_dim < 2 or rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and at least 2, got {rotary_dim}")
        self.rotary_dim, self.base = rotary_dim, base
        cos, sin = rotary_tables(n_pos, rotary_dim, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor,
                start: Positions = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, H, T, D) at positions start .. start + T - 1: the same for every batch
        row (an int; right padding leaves the real positions at 0 ..), or one start per row
        (B,) (a cache whose rows are at different positions) -> both rotated. A traced call
        (a symbolic start, as in the ONNX export) uses the tables as they are."""
        positions, end = position_ids(start, q.shape[2], q.device)
        if isinstance(end, int) and end > self.cos.shape[0]:
            self._grow(end)
        rotate = self.kern.rotary
        return rotate(q, self.cos, self.sin, positions), rotate(k, self.cos, self.sin, positions)

    def _grow(self, n_pos: int) -> None:
        # Normal tensors even when growing during generation (under inference_mode), so that
        # training afterwards can save them for backward.
        with torch.inference_mode(False):
            cos, sin = rotary_tables(max(n_pos, 2 * self.cos.shape[0]), self.rotary_dim,
                                     self.base, self.cos.dtype)
            self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
