"""The LM head and its loss fused: mean cross-entropy of x @ weight^T + bias against targets,
computed chunk by chunk of rows so that the (N, V) logits never exist.

For a vocabulary of 50,257 and 4,096 positions the logits alone take 823 MB in float32, and the
unfused F.linear + F.cross_entropy keeps several such tensors alive at once (the logits, the log
softmax it saves, their gradients). Here the rows go through in chunks of at most CHUNK_BYTES of
logits: per chunk, ATen's matmul (MKL / cuBLAS) gives the chunk's logits, our cross-entropy op
(torch.ops.pygpt.cross_entropy) its loss and our backward op its logits' gradient, and, when
gradients are wanted, the chunk's contributions to them are taken at once (as Liger-Kernel's
fused linear cross-entropy does): grad_x rows = g @ weight, grad_weight += g^T x,
grad_bias += g summed over rows. So at any time only one chunk of logits and one of their
gradient exist (our backward op writes a fresh tensor, so the two do not share memory), besides
the gradients themselves; the backward only scales them by the loss's incoming gradient.

The op, `torch.ops.pygpt.linear_cross_entropy`, lives in C++ like every other pygpt op
(csrc/bindings/linear_cross_entropy.cpp: its schema, argument checks, the chunked loop and its
autograd, so no Python runs per call); it runs on CPU and CUDA (wherever our cross-entropy op
runs). Here are its fake (with the shape checks, so that a traced call fails as an eager one
does), so it also runs under opcheck, torch.compile and export, the chunk size, and the public
function. The gradients are first-order only: the backward refuses to build a graph for a
double backward rather than give a wrong one.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.precision import Policy, call

__all__ = ["linear_cross_entropy", "CHUNK_BYTES", "chunk_rows"]

OP = "pygpt.linear_cross_entropy"

# A chunk's logits take at most this many bytes (and their gradient as many again): 164 rows at
# N = 4,096, V = 50,257 in float32, 25 chunks. The chunk size hardly matters for speed: at
# N = 2,048, C = 768, V = 50,257 (1 thread), 82 to 2,048 rows per chunk all ran within the noise
# (12.9-13.5 s per forward + backward, on a loaded machine), so the bound is set by memory: a
# chunk's logits stay a small fraction (4% here) of the unfused path's (N, V) ones.
CHUNK_BYTES = 32 * 2**20


def chunk_rows(n: int, v: int, dtype: torch.dtype, max_bytes: Optional[int] = None) -> int:
    """Rows per chunk for n rows of v logits of dtype: as many as fit in max_bytes (default
    CHUNK_BYTES; at least one row), then evened out over the chunks so that the last one is not
    a sliver."""
    max_bytes = CHUNK_BYTES if max_bytes is None else max_bytes
    fit = max(1, max_bytes // max(1, v * torch.finfo(dtype).bits // 8))
    chunks = max(1, -(-n // fit))
    return max(1, -(-n // chunks))


def _check_args(x: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor],
                label_smoothing: float, rows: int) -> None:
    """The shape, dtype and device checks of the fake, with the C++ kernel's messages (so that a
    traced call fails as an eager one does); the targets' values are checked by the kernel."""
    if x.dim() != 2:
        raise ValueError(f"{OP}: x must be 2-D (N, C), got shape {tuple(x.shape)}")
    if weight.dim() != 2 or weight.shape[1] != x.shape[1]:
        raise ValueError(f"{OP}: weight must be (V, C) with C = {x.shape[1]} as x's last "
                         f"dimension, got shape {tuple(weight.shape)}")
    if targets.shape != x.shape[:1]:
        raise ValueError(f"{OP}: targets must be 1-D ({x.shape[0]},) to match x's rows, got "
                         f"shape {tuple(targets.shape)}")
    if bias is not None and bias.shape != weight.shape[:1]:
        raise ValueError(f"{OP}: bias must have shape ({weight.shape[0]},) to match weight's "
                         f"rows, got {tuple(bias.shape)}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{OP}: x must be a floating-point tensor, got {x.dtype}")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != x.dtype:
            raise ValueError(f"{OP}: {name} is {t.dtype} but x is {x.dtype}; they must match")
    if targets.dtype != torch.int64:
        raise ValueError(f"{OP}: targets must have dtype int64, got {targets.dtype}")
    for name, t in (("weight", weight), ("targets", targets), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise RuntimeError(f"{OP}: {name} is on {t.device} but x is on {x.device}; all "
                               "tensors must be on the same device")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{OP}: label_smoothing must be a finite number in [0, 1], got "
                         f"{label_smoothing}")
    if rows < 1:
        raise ValueError(f"{OP}: chunk_rows must be >= 1, got {rows}")


@torch.library.register_fake("pygpt::linear_cross_entropy")
def _linear_cross_entropy_fake(x, weight, targets, bias, ignore_index, label_smoothing,
                               chunk_rows, grad_x, grad_weight, grad_bias):
    _check_args(x, weight, targets, bias, label_smoothing, chunk_rows)
    return (x.new_empty(()), x.new_empty(x.shape if grad_x else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)),
            x.new_empty(bias.shape if grad_bias and bias is not None else (0,)))


def linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor,
                         bias: Optional[Tensor] = None, ignore_index: int = -100,
                         label_smoothing: float = 0.0, *,
                         chunk_rows: Optional[int] = None) -> Tensor:
    """F.cross_entropy(F.linear(x, weight, bias), targets, ignore_index=ignore_index,
    label_smoothing=label_smoothing) for x (N, C), weight (V, C), bias (V,) and int64 targets
    (N,), without the (N, V) logits: rows go through `chunk_rows` at a time (default: as many as
    keep a chunk's logits within CHUNK_BYTES). Differentiable in x, weight and bias; the
    gradients are computed during the forward, for the inputs that require them."""
    want = torch.is_grad_enabled()
    rows = chunk_rows if chunk_rows is not None else pick_rows(x, weight)
    (loss, _, _, _), dtype = call(
        Policy.LOW, torch.ops.pygpt.linear_cross_entropy, x, weight, targets, bias, ignore_index,
        label_smoothing, rows, want and x.requires_grad, want and weight.requires_grad,
        want and bias is not None and bias.requires_grad)
    return loss.to(dtype)


def pick_rows(x: Tensor, weight: Tensor) -> int:
    """The default chunk_rows for x (N, C) and weight (V, C) (see chunk_rows)."""
    n = x.shape[0] if x.dim() >= 1 else 1
    v = weight.shape[0] if weight.dim() >= 1 else 1
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return chunk_rows(n, v, dtype)


def torch_linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor,
                               bias: Optional[Tensor] = None, ignore_index: int = -100,
                               label_smoothing: float = 0.0) -> Tensor:
    """pygpt.ops.linear_cross_entropy unfused, its plain-PyTorch reference: the (N, V) logits,
    then their cross-entropy."""
    return F.cross_entropy(F.linear(x, weight, bias), targets, ignore_index=ignore_index,
                           label_smoothing=label_smoothing)
