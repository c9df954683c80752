"""The keys and values a decoder has already computed, so that a decode step costs one position.

A KVCache holds one LayerKV per attention layer. An attention layer given its LayerKV appends the
keys and values of the new positions and attends over all of them. The cache's length is the
number of positions it holds; its position is the number seen, which is also where the next
positions start. The two differ only in a rolling cache (a `window`), which keeps the last
`window` positions and drops the oldest as new ones come, for models whose attention depends on
relative positions only (pygpt.config.RELATIVE_ENCODINGS): decoding goes on past the context
length without recomputing the window.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch


class LayerKV:
    """One layer's keys and values, each (B, H, length, head_dim); empty until first appended.
    With a window, at most that many positions are kept (the oldest dropped first)."""

    def __init__(self, k: Optional[torch.Tensor] = None, v: Optional[torch.Tensor] = None,
                 window: Optional[int] = None):
        if (k is None) != (v is None):
            raise ValueError("a layer's cache needs both keys and values, or neither")
        if window is not None and window < 1:
            raise ValueError(f"a rolling cache's window must be at least 1, got {window}")
        self.k, self.v, self.window = k, v, window
        self.dropped = 0  # positions no longer held (rolling cache)

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    @property
    def position(self) -> int:
        """The position of the next entry: every position seen, dropped ones included."""
        return self.dropped + self.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Adds the new positions' keys and values; returns all keys and values held. A rolling
        cache then drops its oldest beyond the window; once full it takes one position at a
        time, so that each new query sees exactly the last `window` positions."""
        new = k.shape[2]
        over = 0 if self.window is None else self.length + new - self.window
        if over > 0 and new > 1:
            raise ValueError(f"a full rolling cache (window {self.window}) takes one position "
                             f"at a time, got {new}")
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        if over > 0:
            k, v = k[:, :, over:], v[:, :, over:]
            self.dropped += over
        self.k, self.v = k, v
        return k, v


class KVCache:
    """Per attention layer, the keys and values of the positions seen so far (with a window:
    of the last `window` of them)."""

    def __init__(self, n_layer: int, window: Optional[int] = None):
        self.layers = [LayerKV(window=window) for _ in range(n_layer)]

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
        """Positions held (0 for a new cache)."""
        return self.layers[0].length if self.layers else 0

    @property
    def position(self) -> int:
        """Positions seen so far, where the next ones start (0 for a new cache)."""
        return self.layers[0].position if self.layers else 0

    def __len__(self) -> int:
        """The number of layers."""
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerKV:
        return self.layers[layer]
