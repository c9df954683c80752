"""pygpt's kernels as differentiable PyTorch ops: attention, layer_norm, cross_entropy, rotary,
and the fused bias_gelu and add_layer_norm (defined in pygpt.fused_ops).

Importing this module loads the compiled extension `pygpt._C`, which registers
`torch.ops.pygpt.*`. Where each part lives:

- csrc/bindings/registration.cpp: the op schemas (forward and backward of each op);
- csrc/cpu/ and csrc/cuda/: the kernels' math, framework-free (pointers and sizes in), so each
  compiles and is tested on its own (tests/native; the CUDA ones also on a host emulator of CUDA);
  csrc/common/: what both share (the attention shape);
- csrc/bindings/*_cpu.cpp, *_cuda.cpp: the torch bindings, which check every argument at the op
  boundary and register the kernel for the CPU or CUDA dispatch key (CUDA only in a CUDA build);
- csrc/bindings/autograd.cpp: each op's autograd (a C++ torch::autograd::Function that calls the
  op's own backward kernel), so that no Python runs per op call in training.

Here each op gets a fake implementation, so the ops work under `torch.library.opcheck`,
`torch.compile` and export. The raw ops return what their backward needs besides the result
(the log-sum-exp rows, the layer norm statistics); the functions below return only the result.
pygpt.kernels pairs them with their plain-PyTorch references.
"""
from __future__ import annotations

from typing import Optional

import torch

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.fused_ops import add_layer_norm, bias_gelu
from pygpt.ops.linear_cross_entropy import linear_cross_entropy  # the fused LM head + loss
from pygpt.op_support import check_same_device as _check_same_device, stats_dtype as _stats_dtype

__all__ = ["attention", "layer_norm", "cross_entropy", "rotary", "bias_gelu", "add_layer_norm",
           "linear_cross_entropy"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              scale: Optional[float] = None, q_lengths: Optional[torch.Tensor] = None,
              kv_lengths: Optional[torch.Tensor] = None, rel_bias: Optional[torch.Tensor] = None,
              alibi_slopes: Optional[torch.Tensor] = None) -> torch.Tensor:
    """softmax(scale * q k^T + bias + mask) v for q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv).

    `scale` defaults to 1/sqrt(Dk). With `causal`, query i sees keys j <= i + (Tk - Tq): the
    queries are the last Tq positions, as in a decode step over a KV cache. A query that sees no
    key (only possible when Tq > Tk) outputs zeros.

    Right-padded batches: `q_lengths` and `kv_lengths`, int32 or int64 tensors (B,) on q's
    device, give each batch row's number of real queries and keys (None: all Tq / Tk). Row b
    attends only to its real keys, causal aligned bottom-right per row (query i sees keys
    j <= i + kv_lengths[b] - q_lengths[b]); padded queries output zeros, padded positions get
    zero gradients, and the kernels skip the padded work and never read the padding.

    Position biases, computed inside the kernels from the distance d = j - pos(i) of key j to
    query i (pos(i) = i + kv_length - q_length: the queries are the row's last positions, as for
    the causal mask), so no (Tq, Tk) bias ever exists: `rel_bias` (H, 2R + 1) adds the learned
    rel_bias[h, clamp(d, -R, R) + R]; `alibi_slopes` (H,) adds ALiBi's -alibi_slopes[h] * |d|.
    Both have q's dtype and device; both get gradients.

    NaN or inf in the inputs propagates, as in softmax: a query that sees a non-finite score
    outputs NaN; only a query that sees no key at all outputs zeros.
    """
    out, _ = torch.ops.pygpt.attention(q, k, v, causal, scale, q_lengths, kv_lengths, rel_bias,
                                       alibi_slopes)
    return out


def layer_norm(x: torch.Tensor, weight: Optional[torch.Tensor] = None,
               bias: Optional[torch.Tensor] = None, eps: float = 1e-5) -> torch.Tensor:
    """Layer normalisation over the last dimension, as `F.layer_norm(x, x.shape[-1:], ...)`."""
    y, _, _ = torch.ops.pygpt.layer_norm(x, weight, bias, eps)
    return y


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean softmax cross-entropy of logits (N, V) against int64 targets (N,), as
    `F.cross_entropy`; targets equal to `ignore_index` count for nothing. `label_smoothing` s in
    [0, 1] mixes the uniform distribution into the target, as in `F.cross_entropy`: a row's loss
    is (1 - s) * (lse - x[target]) + s * (lse - mean(x))."""
    loss, _ = torch.ops.pygpt.cross_entropy(logits, targets, ignore_index, label_smoothing)
    return loss


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
    return torch.ops.pygpt.rotary(x, cos, sin, positions, False)


# --- attention -------------------------------------------------------------------------------

@torch.library.register_fake("pygpt::attention")
def _attention_fake(q, k, v, causal=True, scale=None, q_lengths=None, kv_lengths=None,
                    rel_bias=None, alibi_slopes=None):
    _check_same_device("pygpt.attention", q=q, k=k, v=v, q_lengths=q_lengths,
                       kv_lengths=kv_lengths, rel_bias=rel_bias, alibi_slopes=alibi_slopes)
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[-1])), q.new_empty((B, H, Tq), dtype=_stats_dtype(q))


@torch.library.register_fake("pygpt::attention_backward")
def _attention_backward_fake(grad_out, q, k, v, out, lse, causal, scale, q_lengths=None,
                             kv_lengths=None, rel_bias=None, alibi_slopes=None):
    _check_same_device("pygpt.attention_backward", q=q, grad_out=grad_out, k=k, v=v, out=out,
                       lse=lse, q_lengths=q_lengths, kv_lengths=kv_lengths, rel_bias=rel_bias,
                       alibi_slopes=alibi_slopes)
    # The kernels return contiguous gradients whatever the inputs' strides; (0,) for a bias
    # input not given.
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            *(q.new_empty(b.shape if b is not None else (0,)) for b in (rel_bias, alibi_slopes)))


# --- layer norm ------------------------------------------------------------------------------

@torch.library.register_fake("pygpt::layer_norm")
def _layer_norm_fake(x, weight=None, bias=None, eps=1e-5):
    _check_same_device("pygpt.layer_norm", x=x, weight=weight, bias=bias)
    stats = x.new_empty(x.shape[:-1], dtype=_stats_dtype(x))
    return x.new_empty(x.shape), stats, torch.empty_like(stats)


@torch.library.register_fake("pygpt::layer_norm_backward")
def _layer_norm_backward_fake(grad_y, x, weight, mean, rstd, weight_grad, bias_grad):
    _check_same_device("pygpt.layer_norm_backward", x=x, grad_y=grad_y, weight=weight, mean=mean,
                       rstd=rstd)
    C = x.shape[-1]
    return (x.new_empty(x.shape), x.new_empty((C if weight_grad else 0,)),
            x.new_empty((C if bias_grad else 0,)))


# --- cross-entropy ---------------------------------------------------------------------------

def _check_label_smoothing(op: str, label_smoothing: float) -> None:
    """The kernels' check, also made by the fakes (so that a traced call fails as an eager one)."""
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be a finite number in [0, 1], got "
                         f"{label_smoothing}")


@torch.library.register_fake("pygpt::cross_entropy")
def _cross_entropy_fake(logits, targets, ignore_index=-100, label_smoothing=0.0):
    _check_same_device("pygpt.cross_entropy", logits=logits, targets=targets)
    _check_label_smoothing("pygpt.cross_entropy", label_smoothing)
    return logits.new_empty(()), logits.new_empty(logits.shape[:1], dtype=_stats_dtype(logits))


@torch.library.register_fake("pygpt::cross_entropy_backward")
def _cross_entropy_backward_fake(grad_loss, logits, targets, lse, ignore_index,
                                 label_smoothing=0.0):
    _check_same_device("pygpt.cross_entropy_backward", logits=logits, grad_loss=grad_loss,
                       targets=targets, lse=lse)
    _check_label_smoothing("pygpt.cross_entropy_backward", label_smoothing)
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


# --- rotary ----------------------------------------------------------------------------------

@torch.library.register_fake("pygpt::rotary")
def _rotary_fake(x, cos, sin, positions, inverse=False):
    _check_same_device("pygpt.rotary", x=x, cos=cos, sin=sin, positions=positions)
    return x.new_empty(x.shape)
