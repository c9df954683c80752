"""pygpt.ops.add_layer_norm, fused: (x + residual, layer_norm(x + residual)), a sub-layer's output
added to the residual stream and the next sub-layer's (pre-norm) or this one's (post-norm) layer
norm, one pass over memory and one op call in each direction; gradients reaching the sum from its
other uses and through the norm are added in the same backward pass.

Here: the public function, the fake implementations of the raw ops (torch.ops.pygpt.add_layer_norm
and add_layer_norm_backward), the plain-PyTorch reference (torch_add_layer_norm) and the ONNX
translation (add_layer_norm_onnx).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device, stats_dtype
from pygpt.ops.layer_norm import layer_norm_onnx
from pygpt.ops.onnx_opset import onnx_ops
from pygpt.ops.precision import Policy, call


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor,
                   weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)) with s = x + residual (same shape).
    Both outputs are differentiable: the gradient of x and of residual is the sum's, which
    gathers the layer norm's backward and the gradient from the sum's other uses."""
    (s, y, _, _), dtype = call(Policy.FLOAT32, torch.ops.pygpt.add_layer_norm, x, residual, weight,
                               bias, eps)
    return s.to(dtype), y.to(dtype)


@torch.library.register_fake("pygpt::add_layer_norm")
def _add_layer_norm_fake(x, residual, weight=None, bias=None, eps=1e-5):
    check_same_device("pygpt.add_layer_norm", x=x, residual=residual, weight=weight, bias=bias)
    stats = x.new_empty(x.shape[:-1], dtype=stats_dtype(x))
    return x.new_empty(x.shape), x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.register_fake("pygpt::add_layer_norm_backward")
def _add_layer_norm_backward_fake(grad_y, grad_sum, sum, weight, mean, rstd, weight_grad,
                                  bias_grad):
    check_same_device("pygpt.add_layer_norm_backward", sum=sum, grad_y=grad_y,
                      grad_sum=grad_sum, weight=weight, mean=mean, rstd=rstd)
    C = sum.shape[-1]
    return (sum.new_empty(sum.shape), sum.new_empty((C if weight_grad else 0,)),
            sum.new_empty((C if bias_grad else 0,)))


def torch_add_layer_norm(x: torch.Tensor, residual: torch.Tensor,
                         weight: Optional[torch.Tensor] = None,
                         bias: Optional[torch.Tensor] = None,
                         eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    s = x + residual
    return s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)


def add_layer_norm_onnx(x, residual, weight=None, bias=None, eps: float = 1e-5):
    """pygpt.add_layer_norm as Add and then LayerNormalization (as layer_norm_onnx)."""
    op = onnx_ops()
    s = op.Add(x, residual)
    return (s, *layer_norm_onnx(s, weight, bias, eps))
