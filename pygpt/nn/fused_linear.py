"""FusedLinear: several linear maps of the same input side by side in one nn.Linear, so that
they cost one matmul (and one weight-gradient matmul) instead of one each, as attention's W_Q,
W_K and W_V do. Each map's output is a view of the one result; a subset of the maps (keys and
values only) is one matmul with a slice of the weight."""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn


class FusedLinear(nn.Linear):
    """An nn.Linear(in_features, sum(widths)) whose output rows are `widths` maps in order.
    Its weight is initialised as nn.Linear's (which depends on in_features only); an init that
    depends on a map's own shape (Xavier's) goes over weight_blocks()."""

    def __init__(self, in_features: int, widths: Sequence[int], bias: bool = True):
        if not widths or min(widths) < 1:
            raise ValueError(f"widths must be positive output widths, got {tuple(widths)}")
        super().__init__(in_features, sum(widths), bias=bias)
        self.widths = tuple(widths)

    def parts(self, x: torch.Tensor, start: int = 0,
              stop: Optional[int] = None) -> tuple[torch.Tensor, ...]:
        """The outputs of maps start .. stop - 1 (default all) for x: views of one matmul's
        result (its last dimension split), never copies."""
        widths = self.widths[start:stop]
        if len(widths) == len(self.widths):
            y = self(x)
        else:
            lo, n = sum(self.widths[:start]), sum(widths)
            bias = self.bias.narrow(0, lo, n) if self.bias is not None else None
            y = F.linear(x, self.weight.narrow(0, lo, n), bias)
        return y.split(widths, dim=-1)


def weight_blocks(linear: nn.Linear) -> tuple[torch.Tensor, ...]:
    """The weight of each map of linear (one for a plain nn.Linear), as views to initialise in
    place: rows of the weight, so each is contiguous and draws as its own nn.Linear's would."""
    if isinstance(linear, FusedLinear):
        return linear.weight.split(linear.widths, dim=0)
    return (linear.weight,)
