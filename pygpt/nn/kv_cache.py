"""The keys and values a decoder has already computed, so that a decode step costs one position.

A KVCache holds one LayerKV per attention layer. An attention layer given its LayerKV appends the
keys and values of the new positions and attends over all of them; the cache's length is the
number of positions seen, which is also where the next positions start.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


class LayerKV:
    """One layer's keys and values, each (B, H, length, head_dim); empty until first appended."""

    def __init__(self, k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None):
        if (k is None) != (v is None):
            raise ValueError("a layer's cache needs both keys and values, or neither")
        self.k, self.v = k, v

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds the new positions' keys and values; returns all keys and values so far."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Per attention layer, the keys and values of the positions seen so far."""

    def __init__(self, n_layer: int):
        self.layers = [LayerKV() for _ in range(n_layer)]

    @classmethod
    def from_tensors(cls, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> "KVCache":
        """A cache holding the given (keys, values) per layer (e.g. an exported graph's past)."""
        cache = cls(0)
        cache.layers = [LayerKV(k, v) for k, v in pairs]
        return cache

    def tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.k, layer.v) for layer in self.layers]

    @property
    def length(self) -> int:
        """Positions seen so far (0 for a new cache)."""
        return self.layers[0].length if self.layers else 0

    def __len__(self) -> int:
        """The number of layers."""
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]
