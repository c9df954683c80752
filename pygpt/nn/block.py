"""One transformer layer: attention, then an optional MLP, each a sub-layer with a residual
connection and a layer norm placed before it (pre-norm, GPT-2's), after the residual add
(post-norm, the original Transformer's and BERT's "Add & Norm"), or nowhere.

Where a residual add is followed by a layer norm of its sum (pre-norm: the next sub-layer's
norm; post-norm: this sub-layer's), the two run as one kernel, LayerNorm.add_norm."""
from __future__ import annotations

from typing import Callable, Literal, Optional

import torch

from pygpt.kernels import KernelModule
from pygpt.nn.attention import MultiHeadAttention
from pygpt.nn.kv_cache import LayerKV
from pygpt.nn.layer_norm import LayerNorm
from pygpt.nn.mlp import MLP
from pygpt.nn.position_bias import ScoreBias

NormPlacement = Literal["pre", "post", "none"]
Sublayer = Callable[[torch.Tensor], torch.Tensor]


class Block(KernelModule):
    def __init__(self, dim: int, attn: MultiHeadAttention, mlp: Optional[MLP] = None, *,
                 norm: NormPlacement = "pre", residual: bool = True, norm_eps: float = 1e-5):
        super().__init__()
        if norm not in ("pre", "post", "none"):
            raise ValueError(f"norm must be 'pre', 'post' or 'none', got {norm!r}")
        self.norm, self.residual = norm, residual
        self.attn_norm = LayerNorm(dim, norm_eps) if norm != "none" else None
        self.attn = attn
        self.mlp_norm = LayerNorm(dim, norm_eps) if norm != "none" and mlp is not None else None
        self.mlp = mlp

    def _sublayers(self, x: torch.Tensor, sublayers: list[tuple[Optional[LayerNorm], Sublayer]]
                   ) -> torch.Tensor:
        """The (norm, layer) sub-layers in turn, with their residual connections and norms."""
        if self.norm == "pre" and self.residual:
            # x + layer(h) and the next sub-layer's norm of it are one add_norm.
            h = sublayers[0][0](x)
            for (_, layer), (next_norm, _) in zip(sublayers, sublayers[1:]):
                x, h = next_norm.add_norm(layer(h), x)
            return x + sublayers[-1][1](h)
        for norm, layer in sublayers:
            if self.norm == "pre":
                x = layer(norm(x))
            elif self.norm == "post" and self.residual:
                x = norm.add_norm(layer(x), x)[1]  # Add & Norm
            elif self.norm == "post":
                x = norm(layer(x))
            else:
                x = x + layer(x) if self.residual else layer(x)
        return x

    def forward(self, x: torch.Tensor, cache: Optional[LayerKV] = None,
                lengths: Optional[torch.Tensor] = None,
                position_bias: Optional[ScoreBias] = None) -> torch.Tensor:
        """x (B, T, dim); lengths (B,): the real positions of each row of a right-padded batch
        (padding rows of the output are not meaningful, only never NaN from attention);
        position_bias: the model's score bias, for the attention."""
        sublayers = [(self.attn_norm, lambda h: self.attn(h, cache=cache, lengths=lengths,
                                                          position_bias=position_bias))]
        if self.mlp is not None:
            sublayers.append((self.mlp_norm, self.mlp))
        return self._sublayers(x, sublayers)
