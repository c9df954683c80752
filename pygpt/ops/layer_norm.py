"""pygpt.ops.layer_norm: layer normalisation over the last dimension. Here: the public function,
the fake implementations of the raw ops (torch.ops.pygpt.layer_norm and layer_norm_backward), the
plain-PyTorch reference (torch_layer_norm) and the ONNX translation (layer_norm_onnx)."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device, stats_dtype
from pygpt.ops.onnx_opset import onnx_ops
from pygpt.ops.precision import Policy, call


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalisation over the last dimension, as `F.layer_norm(x, x.shape[-1:], ...)`."""
    (y, _, _), dtype = call(Policy.FLOAT32, torch.ops.pygpt.layer_norm, x, weight, bias, eps)
    return y.to(dtype)


@torch.library.register_fake("pygpt::layer_norm")
def _layer_norm_fake(x, weight=None, bias=None, eps=1e-5):
    check_same_device("pygpt.layer_norm", x=x, weight=weight, bias=bias)
    stats = x.new_empty(x.shape[:-1], dtype=stats_dtype(x))
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.register_fake("pygpt::layer_norm_backward")
def _layer_norm_backward_fake(grad_y, x, weight, mean, rstd, weight_grad, bias_grad):
    check_same_device("pygpt.layer_norm_backward", x=x, grad_y=grad_y, weight=weight, mean=mean,
                      rstd=rstd)
    C = x.shape[-1]
    return (x.new_empty(x.shape), x.new_empty((C if weight_grad else 0,)),
            x.new_empty((C if bias_grad else 0,)))


def torch_layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
                     bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], weight, bias, eps)


def layer_norm_onnx(x, weight=None, bias=None, eps: float = 1e-5):
    """pygpt.layer_norm as LayerNormalization, whose three outputs match ours (mean and rstd
    keep the normalised axis as 1 in ONNX, so it is squeezed away)."""
    op = onnx_ops()
    y, mean, rstd = op.LayerNormalization(x, weight, bias, axis=-1, epsilon=eps)
    axis = op.Constant(value_ints=[-1])
    return y, op.Squeeze(mean, axis), op.Squeeze(rstd, axis)
