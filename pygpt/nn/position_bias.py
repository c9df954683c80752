"""Position encodings that bias the attention scores instead of adding vectors to the token
embeddings: a learned relative-position bias (T5-style, one table shared by every layer: a
value per head and clipped key - query distance) or ALiBi (Press et al., 2022: fixed per-head
slopes times the distance). The attention kernels compute the bias from the table or slopes as
they go (pygpt.ops.attention's rel_bias / alibi_slopes), so no (T, T) bias is built; a model
owns one PositionBias and passes its ScoreBias to every self-attention layer."""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
from torch import nn

from pygpt.positions import encoding

# The score biases implemented here (the `score_bias` part of pygpt.positions' encodings).
SCORE_BIASES = ("relative", "alibi")


class ScoreBias(NamedTuple):
    """What an attention layer hands its kernel: rel_bias (H, 2R + 1) and/or alibi_slopes (H,)."""

    rel_bias: Optional[torch.Tensor] = None
    alibi_slopes: Optional[torch.Tensor] = None


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's head slopes (float32, (n_head,)): the geometric sequence 2^(-8/n), 2^(-16/n), ...
    for a power-of-two n; otherwise those of the nearest smaller power of two m, followed by
    every other slope of 2m heads (the paper's rule, so that the slopes still spread evenly)."""
    if n_head < 1:
        raise ValueError(f"n_head must be at least 1, got {n_head}")

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    m = 2 ** int(math.floor(math.log2(n_head)))
    slopes = geometric(m) + geometric(2 * m)[0::2][: n_head - m]
    return torch.tensor(slopes, dtype=torch.float32)


class PositionBias(nn.Module):
    """kind "relative": a learned (n_head, 2 * max_distance + 1) table, initialised to zeros
    (training starts from plain attention); distances beyond max_distance share the edge
    columns. kind "alibi": the fixed slopes, a buffer (not saved with the weights)."""

    def __init__(self, kind: str, n_head: int, max_distance: int = 32):
        super().__init__()
        if kind not in SCORE_BIASES:
            raise ValueError(f"unknown score bias {kind!r}; choose from {', '.join(SCORE_BIASES)}")
        if max_distance < 0:
            raise ValueError(f"max_distance must not be negative, got {max_distance}")
        self.kind = kind
        if kind == "relative":
            self.table = nn.Parameter(torch.zeros(n_head, 2 * max_distance + 1))
        else:
            self.register_buffer("slopes", alibi_slopes(n_head), persistent=False)

    def forward(self) -> ScoreBias:
        if self.kind == "relative":
            return ScoreBias(rel_bias=self.table)
        return ScoreBias(alibi_slopes=self.slopes)


def position_bias(pos_encoding: str, n_head: int, max_distance: int) -> Optional[PositionBias]:
    """The model's PositionBias for a pos_encoding, or None where that encoding has no score
    bias (pygpt.positions)."""
    kind = encoding(pos_encoding).score_bias
    return None if kind is None else PositionBias(kind, n_head, max_distance)
