"""pygpt.ops.rotary: rotary position embedding (RoPE). Here: the public function, the fake
implementation of the raw op (torch.ops.pygpt.rotary, which is also its own backward: the inverse
rotation), the plain-PyTorch reference (torch_rotary) and the ONNX translation (rotary_onnx)."""
from __future__ import annotations

import torch

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device
from pygpt.ops.onnx_opset import onnx_ops
from pygpt.ops.precision import Policy, call


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
           positions: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (RoPE) of x (B, H, T, D), half-split as in GPT-NeoX and LLaMA.

    cos and sin (max_pos, rotary_dim / 2), of x's dtype, hold cos and sin of p * theta_i for
    every position p; their width sets rotary_dim (<= D). positions, int64 (T,) or (B, T), are
    the position ids of x's T rows (per batch row with (B, T): a KV cache offset, or padded rows).
    Channel i < rotary_dim / 2 pairs with channel i + rotary_dim / 2 and the pair is rotated by
    its angle; channels from rotary_dim on pass through. x may be the strided (B, H, T, D) view
    of a (B, T, H * D) projection (contiguous channels; anything else is copied first); the
    result is contiguous. Differentiable in x (the backward is the inverse rotation); the tables
    are fixed and get no gradient."""
    y, dtype = call(Policy.FLOAT32, torch.ops.pygpt.rotary, x, cos, sin, positions, False)
    return y.to(dtype)


@torch.library.register_fake("pygpt::rotary")
def _rotary_fake(x, cos, sin, positions, inverse=False):
    check_same_device("pygpt.rotary", x=x, cos=cos, sin=sin, positions=positions)
    return x.new_empty(x.shape)


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


def rotary_onnx(x, cos, sin, positions, inverse: bool = False):
    """pygpt.rotary in plain ONNX math: the angles of the positions gathered from the tables and
    shaped (B or 1, 1, T, half) to broadcast over the heads, the two halves of the rotated
    channels sliced out and rotated with Mul and Add/Sub, the channels past them concatenated
    back."""
    op = onnx_ops()
    half = op.Shape(cos, start=1, end=2)
    angles_shape = op.Concat(op.Constant(value_ints=[-1, 1]), op.Shape(x, start=2, end=3), half,
                             axis=0)
    c = op.Reshape(op.Gather(cos, positions, axis=0), angles_shape)
    s = op.Reshape(op.Gather(sin, positions, axis=0), angles_shape)
    if inverse:
        s = op.Neg(s)
    axis, start = op.Constant(value_ints=[3]), op.Constant(value_ints=[0])
    rotated, end = op.Add(half, half), op.Constant(value_ints=[2**62])
    x1, x2 = op.Slice(x, start, half, axis), op.Slice(x, half, rotated, axis)
    return op.Concat(op.Sub(op.Mul(x1, c), op.Mul(x2, s)), op.Add(op.Mul(x2, c), op.Mul(x1, s)),
                     op.Slice(x, rotated, end, axis), axis=3)
