"""GPT-2's initialisation (as nanoGPT does it): linear weights ~ N(0, 0.02) with zero biases;
the projections that write into the residual stream (attention's W_O, the MLP's output) ~
N(0, 0.02 / sqrt(2 * n_layer)), so the stream's variance does not grow with depth; learned
position embeddings ~ N(0, 0.02); token embeddings ~ N(0, embed_std), last, because a tied
output head shares their tensor. Layer norms keep their identity initialisation. A fused
projection (attention's Q, K, V) draws map by map, as the separate nn.Linears it stands for."""
from __future__ import annotations

import math
from typing import Iterable

from torch import nn

from pygpt.nn.fused_linear import weight_blocks
from pygpt.nn.position import LearnedPositions


def gpt2_init(model: nn.Module, n_layer: int, residual_projections: Iterable[nn.Linear],
              token_embedding: nn.Embedding, embed_std: float = 0.02) -> None:
    for module in model.modules():
        if isinstance(module, nn.Linear):
            for weight in weight_blocks(module):
                nn.init.normal_(weight, 0.0, 0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    residual_std = 0.02 / math.sqrt(2 * n_layer)
    for proj in residual_projections:
        nn.init.normal_(proj.weight, 0.0, residual_std)
    for module in model.modules():
        if isinstance(module, LearnedPositions):
            nn.init.normal_(module.weight, 0.0, 0.02)
    nn.init.normal_(token_embedding.weight, 0.0, embed_std)
