"""Plain-PyTorch reference implementations used as the test oracle.

Everything here is written out as explicit math (no fused ATen kernels), so that it is small enough
to check by eye. The tests usually evaluate these references in float64, even for float32 inputs,
and compare the kernels' results against that.
"""

import math

import torch


def causal_mask(Tq, Tk, device=None):
    """Boolean (Tq, Tk) mask, True where query i may attend to key j.

    Bottom-right alignment: the Tq queries are the LAST Tq positions of a length-Tk sequence, so
    query i sees keys j <= i + (Tk - Tq). When Tq > Tk the first Tq - Tk query rows see no key
    at all (their row of the mask is all False).

    Note: F.scaled_dot_product_attention(is_causal=True) uses TOP-LEFT alignment (j <= i), which
    only agrees with this mask when Tq == Tk.
    """
    i = torch.arange(Tq, device=device).unsqueeze(1)
    j = torch.arange(Tk, device=device).unsqueeze(0)
    return j <= i + (Tk - Tq)


def attention(q, k, v, causal=True, scale=None, bias=None):
    """Scaled dot-product attention. Returns (out, lse).

    q (B,H,Tq,Dk), k (B,H,Tk,Dk), v (B,H,Tk,Dv) -> out (B,H,Tq,Dv), lse (B,H,Tq).
    scale defaults to 1/sqrt(Dk). bias, if given, broadcasts against the (B,H,Tq,Tk) scores and
    is added to them after the scaling. lse[..., i] = log(sum_j exp(s_ij)) over the keys j that
    query i may see. Rows that see no key (causal with Tq > Tk) get out = 0 and lse = -inf, and
    receive / pass on zero gradient; whether a row sees a key is decided by the mask alone, so
    NaN or infinite scores in a row that sees keys give NaN, as softmax does.
    """
    Tq, Dk = q.shape[-2], q.shape[-1]
    Tk = k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(Dk)
    s = (q @ k.transpose(-2, -1)) * scale  # (B,H,Tq,Tk)
    if bias is not None:
        s = s + bias
    visible = causal_mask(Tq, Tk, q.device) if causal else torch.ones(Tq, Tk, dtype=torch.bool)
    s = s.masked_fill(~visible, float("-inf"))
    # Softmax with the max subtracted; the shift is a constant per row so it is detached. A row
    # that sees no key is shifted by 0 instead of its max (-inf), so exp gives zeros, not nan.
    sees_a_key = visible.any(dim=-1, keepdim=True)
    m = torch.where(sees_a_key, s.amax(dim=-1, keepdim=True).detach(), 0.0)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    p = e / torch.where(sees_a_key, denom, torch.ones_like(denom))
    out = p @ v
    lse = (torch.log(denom) + m).squeeze(-1)  # log(0) = -inf for rows that see nothing
    return out, lse


def position_bias(Tq, Tk, rel_bias=None, alibi_slopes=None):
    """The explicit (H, Tq, Tk) position bias of Tq queries that are the LAST Tq positions of Tk
    keys (query i sits at position i + Tk - Tq), head by head: with d = j - (i + Tk - Tq),
    rel_bias[h, clamp(d, -R, R) + R] for rel_bias (H, 2R + 1), minus alibi_slopes[h] * |d|."""
    table = rel_bias if rel_bias is not None else alibi_slopes
    i = torch.arange(Tq).unsqueeze(1)
    j = torch.arange(Tk).unsqueeze(0)
    d = j - (i + Tk - Tq)  # (Tq, Tk)
    heads = []
    for h in range(table.shape[0]):
        b = torch.zeros(Tq, Tk, dtype=table.dtype)
        if rel_bias is not None:
            R = (rel_bias.shape[1] - 1) // 2
            b = b + rel_bias[h][d.clamp(-R, R) + R]
        if alibi_slopes is not None:
            b = b - alibi_slopes[h] * d.abs()
        heads.append(b)
    return torch.stack(heads)


def padded_attention(q, k, v, q_lengths, kv_lengths, causal=True, scale=None, rel_bias=None,
                     alibi_slopes=None):
    """attention() of a right-padded batch: each batch row b alone on its real prefix of
    q_lengths[b] queries and kv_lengths[b] keys (with its own position_bias of those lengths,
    where a bias is given); padded queries get out = 0 and lse = -inf. The padding itself is
    never read. Returns (out, lse) of the full padded shapes."""
    B, H, Tq, _ = q.shape
    outs, lses = [], []
    for b in range(B):
        lq, lk = int(q_lengths[b]), int(kv_lengths[b])
        if lq > 0 and lk > 0:
            bias = (position_bias(lq, lk, rel_bias, alibi_slopes)
                    if rel_bias is not None or alibi_slopes is not None else None)
            out, lse = attention(q[b:b + 1, :, :lq], k[b:b + 1, :, :lk], v[b:b + 1, :, :lk],
                                 causal, scale, bias)
        else:  # nothing to attend with, or to
            out = q.new_zeros(1, H, lq, v.shape[-1])
            lse = q.new_full((1, H, lq), float("-inf"))
        outs.append(torch.cat([out, q.new_zeros(1, H, Tq - lq, v.shape[-1])], dim=2))
        lses.append(torch.cat([lse, q.new_full((1, H, Tq - lq), float("-inf"))], dim=2))
    return torch.cat(outs), torch.cat(lses)


def layer_norm(x, weight=None, bias=None, eps=1e-5):
    """Layer norm over the last dim. Returns (y, mean, rstd), mean/rstd shaped x.shape[:-1].

    Uses the biased variance, like F.layer_norm.
    """
    mean = x.mean(dim=-1, keepdim=True)
    xc = x - mean
    var = (xc * xc).mean(dim=-1, keepdim=True)
    rstd = 1.0 / torch.sqrt(var + eps)
    y = xc * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean.squeeze(-1), rstd.squeeze(-1)


def cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.0):
    """Mean softmax cross-entropy. Returns (loss, lse) with lse (N,) per row of logits (N, V).

    Rows whose target equals ignore_index are left out of both the sum and the count; if every row
    is ignored the loss is 0/0 = nan (as in F.cross_entropy). This reference's gradient in that
    all-ignored case is nan, whereas PyTorch (and our op) give zero gradient: tests check that case
    directly instead of differentiating this function. With label_smoothing s the target is
    (1 - s) * onehot + s / V, so a row's loss is (1 - s) * (lse - x[t]) + s * (lse - mean(x)).
    """
    m = logits.amax(dim=-1, keepdim=True).detach()
    lse = (torch.log(torch.exp(logits - m).sum(dim=-1, keepdim=True)) + m).squeeze(-1)
    valid = targets != ignore_index
    safe_t = torch.where(valid, targets, torch.zeros_like(targets))
    picked = logits.gather(1, safe_t.unsqueeze(1)).squeeze(1)
    nll = lse - picked
    if label_smoothing:
        nll = (1 - label_smoothing) * nll + label_smoothing * (lse - logits.mean(dim=-1))
    per_row = torch.where(valid, nll, torch.zeros_like(lse))
    loss = per_row.sum() / valid.sum().to(logits.dtype)
    return loss, lse


def rotary(x, cos, sin, positions):
    """Rotary embedding of x (B,H,T,D): each pair of channels (i, i + half), half = cos.shape[1],
    multiplied by the 2x2 rotation matrix [[c, -s], [s, c]] of its row's position (positions
    (T,) or (B,T) index the rows of cos and sin); channels from 2 * half on are copied."""
    B, H, T, D = x.shape
    half = cos.shape[1]
    pos = positions.expand(B, T)
    c, s = cos[pos][:, None], sin[pos][:, None]  # (B, 1, T, half)
    rot = torch.stack([torch.stack([c, -s], dim=-1), torch.stack([s, c], dim=-1)], dim=-2)
    pairs = torch.stack([x[..., :half], x[..., half:2 * half]], dim=-1)[..., None]
    out = (rot @ pairs).squeeze(-1)  # (B, H, T, half, 2)
    return torch.cat([out[..., 0], out[..., 1], x[..., 2 * half:]], dim=-1)
