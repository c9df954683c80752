"""pygpt.ops.bias_gelu, fused: gelu(x + bias), the MLP's first projection's bias and activation
(the projection itself runs without its bias), one pass over memory and one op call in each
direction; its backward gives the input gradient and the bias gradient (a sum over rows) in one
pass. The GELU is the exact (erf) one or its tanh approximation (GPT-2's), chosen as F.gelu's
`approximate` chooses it.

Here: the public function, the fake implementations of the raw ops (torch.ops.pygpt.bias_gelu
and bias_gelu_backward), the ONNX translation (bias_gelu_onnx), and the pair that fills the kernel
sets' linear_gelu slot, gelu(x W^T + b): ext_linear_gelu (a bias-free matmul, then this op) and
its plain-PyTorch reference torch_linear_gelu.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device
from pygpt.ops.onnx_opset import onnx_ops
from pygpt.ops.precision import Policy, call

APPROXIMATIONS = ("none", "tanh")  # F.gelu's names: the exact GELU and its tanh approximation


def bias_gelu(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """gelu(x + bias) over x's last dimension (bias (C,) for x (..., C)), as
    `F.gelu(x + bias, approximate=approximate)`: "none", the exact erf GELU, or "tanh", its tanh
    approximation. Differentiable in x and bias."""
    y, dtype = call(Policy.LOW, torch.ops.pygpt.bias_gelu, x, bias, approximate)
    return y.to(dtype)


def _check_approximate(op: str, approximate: str) -> None:
    """The kernels' refusal of an unknown GELU, made by the fakes too."""
    if approximate not in APPROXIMATIONS:
        raise RuntimeError(f"{op}: approximate must be 'none' or 'tanh', got '{approximate}'")


@torch.library.register_fake("pygpt::bias_gelu")
def _bias_gelu_fake(x, bias, approximate="none"):
    check_same_device("pygpt.bias_gelu", x=x, bias=bias)
    _check_approximate("pygpt.bias_gelu", approximate)
    return x.new_empty(x.shape)


@torch.library.register_fake("pygpt::bias_gelu_backward")
def _bias_gelu_backward_fake(grad_y, x, bias, bias_grad, approximate="none"):
    check_same_device("pygpt.bias_gelu_backward", x=x, grad_y=grad_y, bias=bias)
    _check_approximate("pygpt.bias_gelu_backward", approximate)
    return x.new_empty(x.shape), x.new_empty((x.shape[-1] if bias_grad else 0,))


def ext_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    approximate: str = "none") -> torch.Tensor:
    """gelu(x W^T + b) with the bias and the GELU in one kernel (pygpt.ops.bias_gelu) after a
    bias-free matmul; approximate as F.gelu's ("none": erf, "tanh")."""
    if bias is None:
        return F.gelu(F.linear(x, weight), approximate=approximate)
    return bias_gelu(F.linear(x, weight), bias, approximate)


def torch_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      approximate: str = "none") -> torch.Tensor:
    """gelu(x W^T + b) as PyTorch writes it: the bias added inside the matmul (addmm)."""
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


def bias_gelu_onnx(x, bias, approximate: str = "none"):
    """pygpt.bias_gelu in opset 18, which has Erf and Tanh but no Gelu: with h = x + bias, the
    exact GELU h * (1 + erf(h / sqrt 2)) / 2, or the tanh one h * (1 + tanh(u)) / 2 with
    u = sqrt(2 / pi) * (h + 0.044715 h^3)."""
    op = onnx_ops()
    h = op.Add(x, bias)

    def const(value: float):
        return op.CastLike(op.Constant(value_float=value), h)

    if approximate == "tanh":
        cubic = op.Mul(const(0.044715), op.Mul(h, op.Mul(h, h)))
        inner = op.Tanh(op.Mul(const(math.sqrt(2.0 / math.pi)), op.Add(h, cubic)))
    else:
        inner = op.Erf(op.Mul(h, const(0.7071067811865476)))
    return op.Mul(op.Mul(h, const(0.5)), op.Add(const(1.0), inner))
