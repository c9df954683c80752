"""pygpt.ops.bias_gelu, fused: gelu(x + bias), the MLP's first projection's bias and activation
(the projection itself runs without its bias), one pass over memory and one op call in each
direction; its backward gives the input gradient and the bias gradient (a sum over rows) in one
pass.

Here: the public function, the fake implementations of the raw ops (torch.ops.pygpt.bias_gelu
and bias_gelu_backward), the ONNX translation (bias_gelu_onnx), and the pair that fills the kernel
sets' linear_gelu slot, gelu(x W^T + b): ext_linear_gelu (a bias-free matmul, then this op) and
its plain-PyTorch reference torch_linear_gelu.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device
from pygpt.ops.onnx_opset import onnx_ops


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) over x's last dimension (bias (C,) for x (..., C)), the exact erf GELU as
    `F.gelu(x + bias)`. Differentiable in x and bias."""
    return torch.ops.pygpt.bias_gelu(x, bias)


@torch.library.register_fake("pygpt::bias_gelu")
def _bias_gelu_fake(x, bias):
    check_same_device("pygpt.bias_gelu", x=x, bias=bias)
    return x.new_empty(x.shape)


@torch.library.register_fake("pygpt::bias_gelu_backward")
def _bias_gelu_backward_fake(grad_y, x, bias, bias_grad):
    check_same_device("pygpt.bias_gelu_backward", x=x, grad_y=grad_y, bias=bias)
    return x.new_empty(x.shape), x.new_empty((x.shape[-1] if bias_grad else 0,))


def ext_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                    approximate: str = "none") -> torch.Tensor:
    """gelu(x W^T + b) with the bias and the GELU in one kernel (pygpt.ops.bias_gelu) after a
    bias-free matmul; approximate as F.gelu's ("none": erf, "tanh")."""
    if bias is None or approximate == "tanh":  # TODO(step 2): the kernel's tanh GELU
        return F.gelu(F.linear(x, weight, bias), approximate=approximate)
    return bias_gelu(F.linear(x, weight), bias)


def torch_linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                      approximate: str = "none") -> torch.Tensor:
    """gelu(x W^T + b) as PyTorch writes it: the bias added inside the matmul (addmm)."""
    return F.gelu(F.linear(x, weight, bias), approximate=approximate)


def bias_gelu_onnx(x, bias):
    """pygpt.bias_gelu as the exact GELU of x + bias, h * (1 + erf(h / sqrt 2)) / 2 (opset 18
    has Erf but no Gelu)."""
    op = onnx_ops()
    h = op.Add(x, bias)
    half = op.CastLike(op.Constant(value_float=0.5), h)
    one = op.CastLike(op.Constant(value_float=1.0), h)
    root_half = op.CastLike(op.Constant(value_float=0.7071067811865476), h)
    return op.Mul(op.Mul(h, half), op.Add(one, op.Erf(op.Mul(h, root_half))))
