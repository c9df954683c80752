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

It is a torch.library custom op, `torch.ops.pygpt.linear_cross_entropy`, with a fake and an
autograd formula, so it runs under autograd, opcheck, torch.compile and export, on CPU and CUDA
(wherever our cross-entropy op runs). The gradients are first-order only: the backward refuses
to build a graph for a double backward rather than give a wrong one.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)

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
    """The shape, dtype and device checks, shared by the kernel and its fake (so that a traced
    call fails as an eager one does); the targets' values are checked by the kernel."""
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


def _check_targets(targets: Tensor, v: int, ignore_index: int) -> None:
    bad = ((targets < 0) | (targets >= v)) & (targets != ignore_index)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{OP}: targets[{i}] = {int(targets[i])} is out of range: expected a "
                         f"class in [0, {v}) or ignore_index ({ignore_index})")


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _empty_grads(x: Tensor, weight: Tensor, bias: Optional[Tensor], want_x: bool,
                 want_weight: bool, want_bias: bool) -> tuple[Tensor, Tensor, Tensor]:
    """The gradient outputs: zeros of the input's shape where wanted, else empty (0,) tensors.
    Accumulated gradients are float32 for half-precision inputs, cast back at the end."""
    acc = _accumulation_dtype(x.dtype)
    return (x.new_zeros(x.shape) if want_x else x.new_empty((0,)),
            weight.new_zeros(weight.shape, dtype=acc) if want_weight else x.new_empty((0,)),
            x.new_zeros(bias.shape, dtype=acc) if want_bias and bias is not None
            else x.new_empty((0,)))


@torch.library.custom_op("pygpt::linear_cross_entropy", mutates_args=())
def _linear_cross_entropy(x: Tensor, weight: Tensor, targets: Tensor, bias: Optional[Tensor],
                          ignore_index: int, label_smoothing: float, chunk_rows: int,
                          grad_x: bool, grad_weight: bool, grad_bias: bool
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Returns (mean loss, grad_x, grad_weight, grad_bias): the gradients of the loss asked for
    by the flags (of a loss gradient of one), empty (0,) tensors for those not asked for."""
    _check_args(x, weight, targets, bias, label_smoothing, chunk_rows)
    _check_targets(targets, weight.shape[0], ignore_index)
    gx, gw, gb = _empty_grads(x, weight, bias, grad_x, grad_weight, grad_bias)
    counted = targets != ignore_index
    n_valid = counted.sum()
    # Our ops give each chunk's mean loss and gradient over the chunk's own counted rows; the
    # chunk's share (its count / the total count) makes them the whole batch's mean. The share
    # scales the small side of each product (x's rows, grad_x's rows, the bias sums), in float32
    # at least, never the chunk's (rows, V) gradient.
    acc = _accumulation_dtype(x.dtype)
    loss_sum = x.new_zeros((), dtype=torch.float64)
    one = x.new_ones(())
    wanted = grad_x or grad_weight or grad_bias
    w_t = weight.t()
    # One logits buffer for every chunk (fresh pages for each chunk's would cost page faults).
    buffer = x.new_empty((min(chunk_rows, x.shape[0]), weight.shape[0]))
    for start in range(0, x.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        x_c, t_c = x[rows], targets[rows]
        logits = buffer[:x_c.shape[0]]
        if bias is not None:
            torch.addmm(bias, x_c, w_t, out=logits)
        else:
            torch.mm(x_c, w_t, out=logits)
        loss_c, lse = torch.ops.pygpt.cross_entropy(logits, t_c, ignore_index, label_smoothing)
        valid_c = counted[rows].sum()
        loss_sum += torch.where(valid_c > 0, loss_c.double() * valid_c, 0.0)
        if not wanted:
            continue
        g = torch.ops.pygpt.cross_entropy_backward(one, logits, t_c, lse, ignore_index,
                                                   label_smoothing)
        share = (valid_c.double() / n_valid.clamp(min=1)).to(acc)
        if grad_x:
            torch.mm(g, weight, out=gx[rows]).mul_(share)
        if grad_weight:
            gw.addmm_(g.t().to(acc), x_c.to(acc) * share)
        if grad_bias:
            gb += g.sum(0, dtype=acc) * share
        del g  # the buffer and one chunk's gradient are all that live at once
    loss = (loss_sum / n_valid).to(x.dtype)  # 0 / 0 = NaN with no counted target
    return loss, gx, gw.to(weight.dtype), gb.to(x.dtype)


@_linear_cross_entropy.register_fake
def _(x, weight, targets, bias, ignore_index, label_smoothing, chunk_rows, grad_x, grad_weight,
      grad_bias):
    _check_args(x, weight, targets, bias, label_smoothing, chunk_rows)
    return (x.new_empty(()), x.new_empty(x.shape if grad_x else (0,)),
            weight.new_empty(weight.shape if grad_weight else (0,)),
            x.new_empty(bias.shape if grad_bias and bias is not None else (0,)))


def _setup_context(ctx, inputs, output) -> None:
    _, gx, gw, gb = output
    ctx.save_for_backward(gx, gw, gb)
    ctx.computed = inputs[7:10]  # the grad_x, grad_weight, grad_bias flags
    ctx.mark_non_differentiable(gx, gw, gb)
    ctx.set_materialize_grads(False)  # no zero-filled (V, C) gradient for the gradient outputs


def _backward(ctx, grad_loss, _gx, _gw, _gb):
    if torch.is_grad_enabled():
        raise RuntimeError(f"{OP}: double backward is not supported (the gradients are "
                           "computed in the forward, first order only)")
    if grad_loss is None:  # nothing flows back (autograd passes None, not zeros: see above)
        return (None,) * 10
    # A loss's own backward passes 1: then the saved gradients are handed over as they are (the
    # graph releases them, so .grad takes them without a copy) instead of multiplied into new
    # (V, C) tensors. Eager only: a traced graph (fake tensors) keeps the product.
    unit = (type(grad_loss) is Tensor and not torch.compiler.is_compiling()
            and bool(grad_loss == 1))
    grads = []
    for i, (g, computed) in enumerate(zip(ctx.saved_tensors, ctx.computed)):
        if ctx.needs_input_grad[(0, 1, 3)[i]] and not computed:
            raise RuntimeError(f"{OP}: a gradient for {('x', 'weight', 'bias')[i]} is needed "
                               "but was not computed in the forward; call "
                               "pygpt.ops.linear_cross_entropy, which sets the flags")
        grads.append(None if not computed else g if unit else g * grad_loss)
    return grads[0], grads[1], None, grads[2], None, None, None, None, None, None


_linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)


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
    loss, _, _, _ = torch.ops.pygpt.linear_cross_entropy(
        x, weight, targets, bias, ignore_index, label_smoothing, rows,
        want and x.requires_grad, want and weight.requires_grad,
        want and bias is not None and bias.requires_grad)
    return loss


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
