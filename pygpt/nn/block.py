"""One transformer layer: attention, then an optional MLP, each a sub-layer with a residual
connection and a layer norm placed before it (pre-norm, GPT-2's), after the residual add
(post-norm, the original Transformer's and BERT's "Add & Norm"), or nowhere."""
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


class Block(KernelModule):
    def __init__(self, dim: int, attn: MultiHeadAttention, mlp: Optional[MLP] = None, *,
                 norm: NormPlacement = "pre", residual: bool = True):
        super().__init__()
        if norm not in ("pre", "post", "none"):
            raise ValueError(f"norm must be 'pre', 'post' or 'none', got {norm!r}")
        self.norm, self.residual = norm, residual
        self.attn_norm = LayerNorm(dim) if norm != "none" else None
        self.attn = attn
        self.mlp_norm = LayerNorm(dim) if norm != "none" and mlp is not None else None
        self.mlp = mlp

    def _sublayer(self, x: torch.Tensor, norm: Optional[LayerNorm],
                  layer: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        if self.norm == "pre":
            x_in = norm(x)
            return x + layer(x_in) if self.residual else layer(x_in)
        y = x + layer(x) if self.residual else layer(x)
        return norm(y) if self.norm == "post" else y

    def forward(self, x: torch.Tensor, cache: Optional[LayerKV] = None,
                lengths: Optional[torch.Tensor] = None,
                position_bias: Optional[ScoreBias] = None) -> torch.Tensor:
        """x (B, T, dim); lengths (B,): the real positions of each row of a right-padded batch
        (padding rows of the output are not meaningful, only never NaN from attention);
        position_bias: the model's score bias, for the attention."""
        x = self._sublayer(x, self.attn_norm,
                           lambda h: self.attn(h, cache=cache, lengths=lengths,
                                               position_bias=position_bias))
        if self.mlp is not None:
            x = self._sublayer(x, self.mlp_norm, self.mlp)
        return x
