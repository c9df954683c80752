"""The kernel sets a model can run on: ours (`ext`, the C++ ops of pygpt.ops) and plain PyTorch
(`torch`, the reference path and the benchmarks' baseline). Both have the same signatures and
semantics, so a model switches between them by name.

Modules that call kernels, and the modules built around them (blocks, embeddings, models), derive
from KernelModule: setting `.kernels` on one (a whole model, or a single layer norm) switches it
and every kernel module inside it. `use_kernels(module, name)` does the same for any module, such
as a user's nn.Sequential of our blocks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from pygpt import ops
from pygpt.config import KERNEL_SETS


def _lengths(lengths: Optional[torch.Tensor], B: int, T: int, device: torch.device):
    return lengths.long() if lengths is not None else torch.full((B,), T, device=device)


def explicit_position_bias(distance: torch.Tensor, rel_bias: Optional[torch.Tensor],
                           alibi_slopes: Optional[torch.Tensor]) -> torch.Tensor:
    """The explicit (B, H, Tq, Tk) score bias that pygpt.ops.attention computes inside its
    kernels, from the key - query distances (B, 1, Tq, Tk): rel_bias[h, clamp(d, -R, R) + R]
    (rel_bias (H, 2R + 1)) plus -alibi_slopes[h] * |d| (alibi_slopes (H,)); either may be None."""
    bias = torch.zeros((), dtype=(rel_bias if rel_bias is not None else alibi_slopes).dtype,
                       device=distance.device)
    if rel_bias is not None:
        R = (rel_bias.shape[1] - 1) // 2
        bias = bias + rel_bias[:, distance.clamp(-R, R) + R].squeeze(2).movedim(0, 1)
    if alibi_slopes is not None:
        bias = bias - alibi_slopes.view(1, -1, 1, 1) * distance.abs()
    return bias


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                    scale: Optional[float] = None, q_lengths: Optional[torch.Tensor] = None,
                    kv_lengths: Optional[torch.Tensor] = None,
                    rel_bias: Optional[torch.Tensor] = None,
                    alibi_slopes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """pygpt.ops.attention on PyTorch's SDPA. Its is_causal aligns the mask top-left, so when
    there are fewer queries than keys (a decode step) the bottom-right mask is built explicitly.
    With lengths or a position bias, a (B, Tq, Tk) mask of the keys each query sees is built
    (and the bias, explicitly, by explicit_position_bias), the padding is zeroed (it may hold
    anything, NaN included), and queries that see no key give zeros, as our kernels do."""
    B, Tq, Tk = q.shape[0], q.shape[-2], k.shape[-2]
    if q_lengths is None and kv_lengths is None and rel_bias is None and alibi_slopes is None:
        if not causal or Tq == Tk:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        visible = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    lq = _lengths(q_lengths, B, Tq, q.device)[:, None, None, None]
    lk = _lengths(kv_lengths, B, Tk, q.device)[:, None, None, None]
    i = torch.arange(Tq, device=q.device)[:, None]  # (Tq, 1)
    j = torch.arange(Tk, device=q.device)[None, :]  # (1, Tk)
    visible = (i < lq) & (j < lk)  # (B, 1, Tq, Tk)
    if causal:
        visible = visible & (j <= i + lk - lq)
    sees_a_key = visible.any(dim=-1, keepdim=True)  # (B, 1, Tq, 1)
    real_k = j.mT < lk  # (B, 1, Tk, 1)
    q = torch.where(sees_a_key, q, 0.0)
    k, v = torch.where(real_k, k, 0.0), torch.where(real_k, v, 0.0)
    # A query that sees no key attends (harmlessly) to everything, then gives zeros.
    mask = visible | ~sees_a_key
    if rel_bias is not None or alibi_slopes is not None:
        bias = explicit_position_bias(j - (i + lk - lq), rel_bias, alibi_slopes)
        mask = torch.where(mask, bias, float("-inf")).to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.where(sees_a_key, out, 0.0)


def torch_layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def torch_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                        label_smoothing: float = 0.0) -> torch.Tensor:
    return F.cross_entropy(logits, targets, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)


def torch_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               bias: Optional[torch.Tensor] = None, ignore_index: int = -100,
                               label_smoothing: float = 0.0) -> torch.Tensor:
    """pygpt.ops.linear_cross_entropy unfused: the (N, V) logits, then their cross-entropy."""
    return F.cross_entropy(F.linear(x, weight, bias), targets, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)


def torch_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """pygpt.ops.rotary in plain PyTorch: gather the angles of the positions, rotate the two
    halves of the first rotary_dim channels, concatenate the rest back."""
    half = cos.shape[-1]
    c, s = cos[positions], sin[positions]  # (T, half), or (B, T, half)
    if positions.dim() == 2:
        c, s = c[:, None], s[:, None]  # the same angles for every head
    x1, x2 = x[..., :half], x[..., half:2 * half]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)


def ext_linear_gelu(x: torch.Tensor, weight: torch.Tensor,
                    bias: Optional[torch.Tensor]) -> torch.Tensor:
    """gelu(x W^T + b) with the bias and the GELU in one kernel (pygpt.ops.bias_gelu) after a
    bias-free matmul."""
    if bias is None:
        return F.gelu(F.linear(x, weight))
    return ops.bias_gelu(F.linear(x, weight), bias)


def torch_linear_gelu(x: torch.Tensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor]) -> torch.Tensor:
    """gelu(x W^T + b) as PyTorch writes it: the bias added inside the matmul (addmm)."""
    return F.gelu(F.linear(x, weight, bias))


def torch_add_layer_norm(x: torch.Tensor, residual: torch.Tensor,
                         weight: Optional[torch.Tensor] = None,
                         bias: Optional[torch.Tensor] = None,
                         eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)


@dataclass(frozen=True)
class Kernels:
    attention: Callable[..., torch.Tensor]
    layer_norm: Callable[..., torch.Tensor]
    cross_entropy: Callable[..., torch.Tensor]
    rotary: Callable[..., torch.Tensor]
    linear_cross_entropy: Callable[..., torch.Tensor]  # the LM head and its loss, fused
    linear_gelu: Callable[..., torch.Tensor]  # gelu(x W^T + b), the MLP's widening
    add_layer_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]  # (s, layer_norm(s))


KERNELS: dict[str, Kernels] = {
    "ext": Kernels(ops.attention, ops.layer_norm, ops.cross_entropy, ops.rotary,
                   linear_cross_entropy=ops.linear_cross_entropy, linear_gelu=ext_linear_gelu,
                   add_layer_norm=ops.add_layer_norm),
    "torch": Kernels(torch_attention, torch_layer_norm, torch_cross_entropy, torch_rotary,
                     linear_cross_entropy=torch_linear_cross_entropy, linear_gelu=torch_linear_gelu,
                     add_layer_norm=torch_add_layer_norm),
}
assert tuple(KERNELS) == KERNEL_SETS, "pygpt.config.KERNEL_SETS names these kernel sets"


def kernels(name: str) -> Kernels:
    if name not in KERNELS:
        raise ValueError(f"unknown kernels {name!r}; choose from {', '.join(KERNELS)}")
    return KERNELS[name]


class KernelModule(nn.Module):
    """A module whose forward calls a kernel set, `self.kern` (ours by default)."""

    def __init__(self) -> None:
        super().__init__()
        self._kernels_name = KERNEL_SETS[0]
        self.kern = KERNELS[self._kernels_name]

    @property
    def kernels(self) -> str:
        """The name of the kernel set in use; setting it switches every kernel module inside."""
        return self._kernels_name

    @kernels.setter
    def kernels(self, name: str) -> None:
        use_kernels(self, name)


def use_kernels(module: nn.Module, name: str) -> None:
    """Runs every kernel module in module (itself included) on the named kernel set."""
    kern = kernels(name)
    for m in module.modules():
        if isinstance(m, KernelModule):
            m.kern, m._kernels_name = kern, name
