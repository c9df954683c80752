"""The two sets of kernels a model can run on: ours (`ext`, the C++ ops of pygpt.ops) and plain
PyTorch (`torch`, the reference path and the benchmarks' baseline). Both have the same
signatures and semantics, so a model switches between them with one argument."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from pygpt import ops


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                    scale: Optional[float] = None) -> torch.Tensor:
    """pygpt.ops.attention on PyTorch's SDPA. Its is_causal aligns the mask top-left, so when
    there are fewer queries than keys (a decode step) the bottom-right mask is built explicitly."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    if not causal or Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    visible = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def torch_layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def torch_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                        ignore_index: int = -100) -> torch.Tensor:
    return F.cross_entropy(logits, targets, ignore_index=ignore_index)


@dataclass(frozen=True)
class Kernels:
    attention: Callable[..., torch.Tensor]
    layer_norm: Callable[..., torch.Tensor]
    cross_entropy: Callable[..., torch.Tensor]


KERNELS: dict[str, Kernels] = {
    "ext": Kernels(ops.attention, ops.layer_norm, ops.cross_entropy),
    "torch": Kernels(torch_attention, torch_layer_norm, torch_cross_entropy),
}


def kernels(name: str) -> Kernels:
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; choose from {', '.join(KERNELS)}")
    return KERNELS[name]
