"""pygpt's fused ops, differentiable: bias + GELU, and the residual add + layer norm.

Each replaces a pair of ops of a transformer block that run back to back on the same rows, so
that the pair is one pass over memory and one op call in each direction:

- `bias_gelu(x, bias)` = gelu(x + bias), the MLP's first projection's bias and activation (the
  projection itself runs without its bias); its backward gives the input gradient and the bias
  gradient (a sum over rows) in one pass;
- `add_layer_norm(x, residual, ...)` = (x + residual, layer_norm(x + residual)): a sub-layer's
  output added to the residual stream, and the next sub-layer's (pre-norm) or this one's
  (post-norm) layer norm; gradients reaching the sum from its other uses and through the norm
  are added in the same backward pass.

The schemas are in csrc/bindings/registration.cpp, the kernels in csrc/cpu and csrc/cuda
(bias_gelu, add_layer_norm), their autograd in csrc/bindings/autograd_fused.cpp; here each op
gets its fake implementation, as pygpt.ops does for the others (which re-exports these
functions).
"""
from __future__ import annotations

from typing import Optional

import torch

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.op_support import check_same_device, stats_dtype


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """gelu(x + bias) over x's last dimension (bias (C,) for x (..., C)), the exact erf GELU as
    `F.gelu(x + bias)`. Differentiable in x and bias."""
    return torch.ops.pygpt.bias_gelu(x, bias)


def add_layer_norm(x: torch.Tensor, residual: torch.Tensor,
                   weight: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                   eps: float = 1e-5) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, F.layer_norm(s, s.shape[-1:], weight, bias, eps)) with s = x + residual (same shape).
    Both outputs are differentiable: the gradient of x and of residual is the sum's, which
    gathers the layer norm's backward and the gradient from the sum's other uses."""
    s, y, _, _ = torch.ops.pygpt.add_layer_norm(x, residual, weight, bias, eps)
    return s, y


# --- bias + GELU -----------------------------------------------------------------------------

@torch.library.register_fake("pygpt::bias_gelu")
def _bias_gelu_fake(x, bias):
    check_same_device("pygpt.bias_gelu", x=x, bias=bias)
    return x.new_empty(x.shape)


@torch.library.register_fake("pygpt::bias_gelu_backward")
def _bias_gelu_backward_fake(grad_y, x, bias, bias_grad):
    check_same_device("pygpt.bias_gelu_backward", x=x, grad_y=grad_y, bias=bias)
    return x.new_empty(x.shape), x.new_empty((x.shape[-1] if bias_grad else 0,))




# --- residual add + layer norm ---------------------------------------------------------------

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


