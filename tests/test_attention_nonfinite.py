"""NaN and inf in attention's inputs propagate (issue 16 item 6): a query row whose output depends
on a non-finite value is non-finite, never the zeros of a row that sees no key, forward and
backward; rows that see no key (causal Tq > Tk, padding) still give exactly zeros.

Two oracles bracket the kernel. The exact one computes every query row alone over the keys it
sees, so a value reaches exactly the outputs (and, by autograd, the gradients) that depend on it.
The dense one (reference.attention) multiplies masked weights of 0 by the values, which spreads a
NaN to rows that never see it. Every NaN of the exact oracle must be NaN in ours (nothing hidden),
every non-finite of ours must be non-finite in the dense oracle (nothing invented), and where
ours and the exact oracle are finite they agree.
"""

import pytest
import torch

import pygpt.nn
import pygpt.ops
import reference as ref
from helpers import ATTN_TOL, DTYPES, TINY, f64, make_model, rand_tokens

# (B, H, Tq, Tk, Dk, Dv)
SHAPES = [(2, 2, 9, 9, 8, 6), (1, 2, 5, 11, 4, 4), (1, 1, 11, 5, 4, 3), (1, 1, 70, 70, 8, 8)]
POISONS = [float("nan"), float("inf"), float("-inf")]


def exact_attention(q, k, v, causal):
    """Each query row alone over the keys it sees (a row that sees none gives zeros)."""
    Tq, Tk = q.shape[-2], k.shape[-2]
    rows = []
    for i in range(Tq):
        seen = min(max(i + 1 + Tk - Tq, 0), Tk) if causal else Tk
        if seen == 0:
            rows.append(q.new_zeros(*q.shape[:-2], 1, v.shape[-1]))
            continue
        s = q[..., i:i + 1, :] @ k[..., :seen, :].mT / q.shape[-1] ** 0.5
        rows.append(torch.softmax(s, dim=-1) @ v[..., :seen, :])
    return torch.cat(rows, dim=-2)


def poisoned(shape, dtype, where, value, t):
    """q, k, v (requiring grad) with `value` at one element of the named input, position t."""
    B, H, Tq, Tk, Dk, Dv = shape
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(B, H, n, d, generator=g, dtype=dtype)
               for n, d in ((Tq, Dk), (Tk, Dk), (Tk, Dv)))
    target = dict(q=q, k=k, v=v)[where]
    target[-1, -1, min(t, target.shape[2] - 1), 0] = value
    return [x.requires_grad_() for x in (q, k, v)]


def check_bracketed(ours, exact, dense, dtype, what):
    assert (torch.isnan(exact) <= torch.isnan(ours)).all(), f"{what}: a NaN was hidden"
    assert (~torch.isfinite(ours) <= ~torch.isfinite(dense)).all(), f"{what}: NaN/inf invented"
    both = torch.isfinite(ours) & torch.isfinite(exact)
    torch.testing.assert_close(ours[both], exact.to(dtype)[both], **ATTN_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("value", POISONS, ids=str)
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_non_finite_propagates(shape, where, value, causal, dtype):
    for t in (0, shape[2] // 2, 10**6):  # first, middle and last position
        q, k, v = poisoned(shape, dtype, where, value, t)
        out = pygpt.ops.attention(q, k, v, causal=causal)
        eq, ek, ev = f64(q, k, v)
        exact = exact_attention(eq, ek, ev, causal)
        dq, dk, dv = f64(q, k, v)
        dense, _ = ref.attention(dq, dk, dv, causal=causal)
        what = f"{where}[{t}]={value}"
        check_bracketed(out.detach(), exact.detach(), dense.detach(), dtype, what + " out")
        if where != "v":  # a score's NaN or inf reaches exactly the rows that see it
            assert torch.equal(~torch.isfinite(out), ~torch.isfinite(exact)), what
        grad = torch.randn_like(out)
        out.backward(grad)
        exact.backward(grad.double())
        dense.backward(grad.double())
        for name, a, e, d in zip("qkv", (q, k, v), (eq, ek, ev), (dq, dk, dv)):
            check_bracketed(a.grad, e.grad, d.grad, dtype, f"{what} d{name}")


def test_nan_in_a_query_row_is_nan_there_only():
    """The issue's case: one NaN in a query row makes that row NaN (not zeros), and no other."""
    q, k, v = poisoned((1, 1, 6, 6, 4, 4), torch.float32, "q", float("nan"), 3)
    out = pygpt.ops.attention(q, k, v, causal=True)
    assert torch.isnan(out[0, 0, 3]).all()
    assert torch.isfinite(out[0, 0, [0, 1, 2, 4, 5]]).all()


@pytest.mark.parametrize("value", POISONS, ids=str)
def test_rows_that_see_no_key_stay_zero(value):
    """Causal Tq > Tk and padded rows still give exact zeros (lse -inf) beside non-finite keys."""
    q, k, v = poisoned((2, 1, 8, 3, 4, 4), torch.float32, "k", value, 1)
    out, lse = torch.ops.pygpt.attention(q, k, v, True, None)
    assert torch.equal(out[:, :, :5], torch.zeros_like(out[:, :, :5]))
    assert torch.isneginf(lse[:, :, :5]).all()
    lengths = torch.tensor([8, 4])
    out = pygpt.ops.attention(q, k, v, causal=True, q_lengths=lengths,
                              kv_lengths=torch.tensor([3, 2]))
    assert torch.equal(out[1, :, 4:], torch.zeros_like(out[1, :, 4:]))
    out.sum().backward()
    assert torch.equal(q.grad[1, :, 4:], torch.zeros_like(q.grad[1, :, 4:]))


def test_one_nan_weight_gives_a_nan_loss():
    """The issue's symptom: a NaN weight in one attention projection gave a plausible loss."""
    model = make_model(TINY, "ext", spread=0.0)
    attn = next(m for m in model.modules() if isinstance(m, pygpt.nn.MultiHeadAttention))
    with torch.no_grad():
        attn.qkv.weight[0, 0] = float("nan")  # a weight of W_Q
    x, y = rand_tokens(2, TINY.block_size), rand_tokens(2, TINY.block_size, seed=2)
    assert torch.isnan(model(x, y).loss)
