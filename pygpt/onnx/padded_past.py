"""The KV cache as the GPT's exported graph holds it: right-padded rows, each with its own length,
in plain tensor ops that torch.export traces (pygpt.nn.kv_cache's LayerKV does the same with
Python lists, which a graph cannot hold). It has the semantics of LayerKV's rows of different
lengths: row b's real positions are the first past_lengths[b] of the past, a call's new
positions are written at the row's own end, the rest is padding (never read), and each row's
next position (for position embeddings and rotary angles) is its own length. So rows of
different lengths (a prefill of right-padded prompts, or decode steps of rows at different
positions) run in one graph call."""
from __future__ import annotations

from typing import Sequence

import torch


class PaddedLayerPast:
    """One layer's past keys and values (B, H, P, D), the first lengths[b] of row b real."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor):
        self.k, self.v, self.past_lengths, self.lengths = k, v, lengths, lengths

    @property
    def next_positions(self) -> torch.Tensor:
        """Each row's next position (B,): its past length."""
        return self.past_lengths

    def append(self, k: torch.Tensor, v: torch.Tensor,
               lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row b's new keys and values (B, H, T, D), of which the first lengths[b] are real,
        written after its past: returns the (B, H, P + T, D) keys and values, row b's first
        past_lengths[b] + lengths[b] real; lengths becomes those totals. The padding after
        them holds anything (the attention never reads it). The new positions are scattered into
        their slots (ScatterND in the graph), which costs copies of the past, not an index per
        element as a gather would."""
        B, H = self.k.shape[:2]
        T = k.shape[2]
        slot = self.past_lengths[:, None] + torch.arange(T, device=k.device)  # (B, T)
        index = (torch.arange(B, device=k.device)[:, None, None],
                 torch.arange(H, device=k.device)[None, :, None], slot[:, None, :])
        self.k, self.v = (torch.cat([old, torch.zeros_like(new)], dim=2).index_put(index, new)
                          for old, new in ((self.k, k), (self.v, v)))
        self.lengths = self.past_lengths + lengths
        return self.k, self.v


class PaddedPast:
    """PaddedLayerPast per layer, sharing the rows' lengths: what GPT.forward takes as a cache."""

    def __init__(self, pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
                 lengths: torch.Tensor):
        self.layers = [PaddedLayerPast(k, v, lengths) for k, v in pairs]

    @property
    def next_positions(self) -> torch.Tensor:
        return self.layers[0].next_positions

    def tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(layer.k, layer.v) for layer in self.layers]

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, layer: int) -> PaddedLayerPast:
        return self.layers[layer]
