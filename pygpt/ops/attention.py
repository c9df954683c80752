"""pygpt.ops.attention: softmax attention with causal masking, right-padded batches and
position biases computed inside the kernels. Here: the public function, the fake implementations
of the raw ops (torch.ops.pygpt.attention and attention_backward), the plain-PyTorch reference
(torch_attention, on SDPA; attention_weights, its weights formed explicitly, to look at) and
the ONNX translation (attention_onnx)."""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from pygpt import _C  # noqa: F401  (loading the library registers torch.ops.pygpt)
from pygpt.ops.fake_support import check_same_device, stats_dtype
from pygpt.ops.onnx_opset import onnx_ops
from pygpt.ops.precision import Policy, call


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
    (out, _), dtype = call(Policy.LOW, torch.ops.pygpt.attention, q, k, v, causal, scale,
                           q_lengths, kv_lengths, rel_bias, alibi_slopes)
    return out.to(dtype)


# --- fake implementations --------------------------------------------------------------------

@torch.library.register_fake("pygpt::attention")
def _attention_fake(q, k, v, causal=True, scale=None, q_lengths=None, kv_lengths=None,
                    rel_bias=None, alibi_slopes=None):
    check_same_device("pygpt.attention", q=q, k=k, v=v, q_lengths=q_lengths,
                      kv_lengths=kv_lengths, rel_bias=rel_bias, alibi_slopes=alibi_slopes)
    B, H, Tq, _ = q.shape
    return q.new_empty((B, H, Tq, v.shape[-1])), q.new_empty((B, H, Tq), dtype=stats_dtype(q))


@torch.library.register_fake("pygpt::attention_backward")
def _attention_backward_fake(grad_out, q, k, v, out, lse, causal, scale, q_lengths=None,
                             kv_lengths=None, rel_bias=None, alibi_slopes=None):
    check_same_device("pygpt.attention_backward", q=q, grad_out=grad_out, k=k, v=v, out=out,
                      lse=lse, q_lengths=q_lengths, kv_lengths=kv_lengths, rel_bias=rel_bias,
                      alibi_slopes=alibi_slopes)
    # The kernels return contiguous gradients whatever the inputs' strides; (0,) for a bias
    # input not given.
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            *(q.new_empty(b.shape if b is not None else (0,)) for b in (rel_bias, alibi_slopes)))


# --- plain-PyTorch reference -----------------------------------------------------------------

def _lengths(lengths: Optional[torch.Tensor], B: int, T: int, device: torch.device):
    return lengths.long() if lengths is not None else torch.full((B,), T, device=device)


class VisibleKeys(NamedTuple):
    """Which keys each query of pygpt.ops.attention sees, and where they are."""

    visible: torch.Tensor  # (B, 1, Tq, Tk) bool: query i sees key j
    distance: torch.Tensor  # (B, 1, Tq, Tk) int64: j - pos(i), what a position bias reads
    real_keys: torch.Tensor  # (B, 1, Tk, 1) bool: key j is within its row's kv length


def visible_keys(B: int, Tq: int, Tk: int, causal: bool, q_lengths: Optional[torch.Tensor],
                 kv_lengths: Optional[torch.Tensor], device: torch.device) -> VisibleKeys:
    """The mask and distances of pygpt.ops.attention's contract: row b's real queries i <
    q_lengths[b] see its real keys j < kv_lengths[b] (None: all), causal ones only those with
    j <= pos(i) = i + kv_lengths[b] - q_lengths[b] (bottom-right aligned)."""
    lq = _lengths(q_lengths, B, Tq, device)[:, None, None, None]
    lk = _lengths(kv_lengths, B, Tk, device)[:, None, None, None]
    i = torch.arange(Tq, device=device)[:, None]  # (Tq, 1)
    j = torch.arange(Tk, device=device)[None, :]  # (1, Tk)
    visible = (i < lq) & (j < lk)  # (B, 1, Tq, Tk)
    if causal:
        visible = visible & (j <= i + lk - lq)
    return VisibleKeys(visible, j - (i + lk - lq), j.mT < lk)


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
    seen = visible_keys(B, Tq, Tk, causal, q_lengths, kv_lengths, q.device)
    sees_a_key = seen.visible.any(dim=-1, keepdim=True)  # (B, 1, Tq, 1)
    q = torch.where(sees_a_key, q, 0.0)
    k, v = torch.where(seen.real_keys, k, 0.0), torch.where(seen.real_keys, v, 0.0)
    # A query that sees no key attends (harmlessly) to everything, then gives zeros.
    mask = seen.visible | ~sees_a_key
    if rel_bias is not None or alibi_slopes is not None:
        bias = explicit_position_bias(seen.distance, rel_bias, alibi_slopes)
        mask = torch.where(mask, bias, float("-inf")).to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.where(sees_a_key, out, 0.0)


class AttentionWeights(NamedTuple):
    """torch_attention's weights, formed explicitly (attention_weights)."""

    scores: torch.Tensor  # (B, H, Tq, Tk): scale * q k^T
    bias: Optional[torch.Tensor]  # (B, H, Tq, Tk): the position bias added to them, or None
    visible: torch.Tensor  # (B, 1, Tq, Tk) bool: the keys each query sees
    probs: torch.Tensor  # (B, H, Tq, Tk): the softmax over the visible keys, 0 elsewhere


def attention_weights(q: torch.Tensor, k: torch.Tensor, *, causal: bool = True,
                      scale: Optional[float] = None, q_lengths: Optional[torch.Tensor] = None,
                      kv_lengths: Optional[torch.Tensor] = None,
                      rel_bias: Optional[torch.Tensor] = None,
                      alibi_slopes: Optional[torch.Tensor] = None) -> AttentionWeights:
    """The attention weights of pygpt.ops.attention for the same arguments (but v), which SDPA
    and our kernels never form: probs @ v, with the padded keys' values zeroed, is
    torch_attention's output. A query that sees no key has a row of zeros."""
    B, Tq, Tk = q.shape[0], q.shape[-2], k.shape[-2]
    seen = visible_keys(B, Tq, Tk, causal, q_lengths, kv_lengths, q.device)
    scores = (q @ k.mT) * (q.shape[-1] ** -0.5 if scale is None else scale)
    bias = None
    if rel_bias is not None or alibi_slopes is not None:
        bias = explicit_position_bias(seen.distance, rel_bias, alibi_slopes).to(q.dtype)
        bias = bias.expand(B, -1, Tq, Tk)
    sees_a_key = seen.visible.any(dim=-1, keepdim=True)
    logits = torch.where(seen.visible, scores if bias is None else scores + bias, float("-inf"))
    probs = torch.where(sees_a_key, torch.where(sees_a_key, logits, 0.0).softmax(dim=-1), 0.0)
    return AttentionWeights(scores, bias, seen.visible, probs)


# --- ONNX translation ------------------------------------------------------------------------

def _onnx_position_bias(distance, rel_bias, alibi_slopes, like):
    """The (1 or B, H, Tq, Tk) score bias of the key - query distances (1 or B, 1, Tq, Tk):
    rel_bias[h, clamp(d, -R, R) + R] gathered from the table (H, 2R + 1), minus
    alibi_slopes[h] * |d|; like the kernels, but built in full in the graph."""
    op = onnx_ops()
    bias = op.CastLike(op.Constant(value_float=0.0), like)
    if rel_bias is not None:
        width = op.Squeeze(op.Shape(rel_bias, start=1, end=2))
        R = op.Div(op.Sub(width, op.Constant(value_int=1)), op.Constant(value_int=2))
        bucket = op.Add(op.Clip(distance, op.Neg(R), R), R)
        gathered = op.Squeeze(op.Gather(rel_bias, bucket, axis=1), op.Constant(value_ints=[2]))
        bias = op.Add(bias, op.Transpose(gathered, perm=[1, 0, 2, 3]))  # (H, B, ..) -> (B, H, ..)
    if alibi_slopes is not None:
        slopes = op.Unsqueeze(alibi_slopes, op.Constant(value_ints=[0, 2, 3]))  # (1, H, 1, 1)
        bias = op.Sub(bias, op.Mul(slopes, op.CastLike(op.Abs(distance), like)))
    return bias


def attention_onnx(q, k, v, causal: bool = True, scale: Optional[float] = None, q_lengths=None,
                   kv_lengths=None, rel_bias=None, alibi_slopes=None):
    """pygpt.attention in ONNX ops: scores, the position bias, the mask, softmax, and the
    log-sum-exp the op also returns. Without lengths the mask is the bottom-right causal one
    (query i sees keys j <= i + Tk - Tq); with lengths it is built in the graph from them, per
    batch row, padded keys and values are zeroed and queries that see no key give zeros, as the
    kernels do. A relative or ALiBi bias (rel_bias, alibi_slopes) is built in the graph as a
    (B, H, Tq, Tk) tensor from the distances, query i at position i + kv_len - q_len."""
    op = onnx_ops()
    if scale is None:
        scale_value = op.Reciprocal(op.Sqrt(op.CastLike(op.Shape(q, start=3, end=4), q)))
    else:
        scale_value = op.CastLike(op.Constant(value_float=scale), q)
    scores = op.Mul(op.MatMul(q, op.Transpose(k, perm=[0, 1, 3, 2])), scale_value)
    neg_inf = op.CastLike(op.Constant(value_float=float("-inf")), q)
    tq = op.Squeeze(op.Shape(q, start=2, end=3))
    tk = op.Squeeze(op.Shape(k, start=2, end=3))
    zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
    query_index = op.Range(zero, tq, one)  # (Tq,)
    key_index = op.Range(zero, tk, one)  # (Tk,)
    biased = rel_bias is not None or alibi_slopes is not None
    if q_lengths is None and kv_lengths is None:
        if biased:
            distance = op.Sub(op.Unsqueeze(key_index, op.Constant(value_ints=[0])),
                              op.Unsqueeze(op.Add(query_index, op.Sub(tk, tq)),
                                           op.Constant(value_ints=[1])))  # (Tq, Tk)
            distance = op.Unsqueeze(distance, op.Constant(value_ints=[0, 1]))
            scores = op.Add(scores, _onnx_position_bias(distance, rel_bias, alibi_slopes, q))
        if causal:
            last_visible = op.Unsqueeze(op.Add(query_index, op.Sub(tk, tq)),
                                        op.Constant(value_ints=[1]))
            scores = op.Where(op.LessOrEqual(op.Unsqueeze(key_index, op.Constant(value_ints=[0])),
                                             last_visible), scores, neg_inf)
        out = op.MatMul(op.Softmax(scores, axis=-1), v)
        return out, op.ReduceLogSumExp(scores, op.Constant(value_ints=[-1]), keepdims=0)
    batch = op.Shape(q, start=0, end=1)

    def lengths_or_full(lengths, full):  # (B, 1, 1, 1) int64
        lengths = (op.Cast(lengths, to=7) if lengths is not None
                   else op.Expand(op.Unsqueeze(full, op.Constant(value_ints=[0])), batch))
        return op.Unsqueeze(lengths, op.Constant(value_ints=[1, 2, 3]))

    lq, lk = lengths_or_full(q_lengths, tq), lengths_or_full(kv_lengths, tk)
    i = op.Unsqueeze(query_index, op.Constant(value_ints=[1]))  # (Tq, 1)
    j = op.Unsqueeze(key_index, op.Constant(value_ints=[0]))  # (1, Tk)
    visible = op.And(op.Less(i, lq), op.Less(j, lk))  # (B, 1, Tq, Tk)
    if biased:
        distance = op.Sub(j, op.Add(i, op.Sub(lk, lq)))  # (B, 1, Tq, Tk)
        scores = op.Add(scores, _onnx_position_bias(distance, rel_bias, alibi_slopes, q))
    if causal:
        visible = op.And(visible, op.LessOrEqual(j, op.Add(i, op.Sub(lk, lq))))
    real_k = op.Less(op.Transpose(j, perm=[1, 0]), lk)  # (B, 1, Tk, 1)
    v = op.Where(real_k, v, op.CastLike(op.Constant(value_float=0.0), v))
    scores = op.Where(visible, scores, neg_inf)
    sees_a_key = op.Cast(op.ReduceMax(op.Cast(visible, to=6), op.Constant(value_ints=[-1]),
                                      keepdims=1), to=9)  # (B, 1, Tq, 1) bool
    weights = op.Where(sees_a_key, op.Softmax(scores, axis=-1),
                       op.CastLike(op.Constant(value_float=0.0), q))
    out = op.MatMul(weights, v)
    return out, op.ReduceLogSumExp(scores, op.Constant(value_ints=[-1]), keepdims=0)
