"""pygpt.ops.attention / torch.ops.pygpt.attention against the explicit-math reference and ATen."""

import math

import pytest
import torch
import torch.nn.functional as F

import pygpt.ops
import reference as ref
from helpers import ATTN_TOL, DTYPES, close, f64, rand

raw = torch.ops.pygpt.attention

# (B, H, Tq, Tk, Dk, Dv)
SHAPES = [
    (1, 1, 1, 1, 1, 1),  # everything length 1
    (1, 1, 1, 1, 4, 6),
    (1, 1, 1, 9, 8, 8),  # one query against a longer history (decode step)
    (2, 3, 7, 7, 16, 16),
    (2, 2, 5, 13, 8, 8),  # Tq < Tk
    (2, 2, 13, 5, 8, 8),  # Tq > Tk: causal rows 0..7 see no key
    (1, 2, 33, 33, 7, 5),  # odd sizes, Dk != Dv, just past one query tile
    (3, 1, 65, 40, 12, 20),
    (1, 2, 40, 65, 33, 3),
    (2, 1, 32, 32, 64, 64),  # exactly one tile
    (1, 3, 97, 97, 24, 24),
    (1, 1, 64, 1, 5, 3),  # single key
    (1, 2, 70, 129, 128, 128),  # key tiles (64) plus one, large head dim
    (1, 1, 1, 2048, 64, 64),  # long decode step
    (1, 1, 64, 64, 3, 130),  # tiny Dk, large Dv
]


def ids(shape):
    return "B{}H{}Tq{}Tk{}Dk{}Dv{}".format(*shape)


def make_qkv(shape, dtype, requires_grad=False):
    B, H, Tq, Tk, Dk, Dv = shape
    q = rand(B, H, Tq, Dk, dtype=dtype, requires_grad=requires_grad)
    k = rand(B, H, Tk, Dk, dtype=dtype, requires_grad=requires_grad)
    v = rand(B, H, Tk, Dv, dtype=dtype, requires_grad=requires_grad)
    return q, k, v


def check_fwd_bwd(q, k, v, causal, scale, tol, what=""):
    """Forward (out, lse) and all three gradients vs the float64 reference."""
    dtype = q.dtype
    out = pygpt.ops.attention(q, k, v, causal=causal, scale=scale)
    out2, lse = raw(q, k, v, causal, scale)
    assert out.dtype == dtype and out.shape == q.shape[:-1] + (v.shape[-1],)
    assert lse.dtype == dtype and lse.shape == q.shape[:-1]
    assert torch.equal(out, out2)

    rq, rk, rv = f64(q, k, v)
    ref_out, ref_lse = ref.attention(rq, rk, rv, causal=causal, scale=scale)
    close(out, ref_out, tol, f"{what} out")
    close(lse, ref_lse, tol, f"{what} lse")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf rows differ"

    if q.requires_grad:
        g = torch.randn_like(out)
        out.backward(g)
        ref_out.backward(g.double())
        close(q.grad, rq.grad, tol, f"{what} dq")
        close(k.grad, rk.grad, tol, f"{what} dk")
        close(v.grad, rv.grad, tol, f"{what} dv")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_forward_backward_vs_reference(shape, causal, dtype):
    q, k, v = make_qkv(shape, dtype, requires_grad=True)
    check_fwd_bwd(q, k, v, causal, None, ATTN_TOL[dtype], ids(shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [0.0, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 2, 9, 9, 16, 8), (1, 2, 5, 11, 6, 10), (1, 1, 11, 5, 6, 6)],
                         ids=ids)
def test_custom_scale(shape, causal, scale, dtype):
    q, k, v = make_qkv(shape, dtype, requires_grad=True)
    check_fwd_bwd(q, k, v, causal, scale, ATTN_TOL[dtype], f"{ids(shape)} scale={scale}")


def test_default_scale_is_inv_sqrt_dk():
    q, k, v = make_qkv((1, 2, 6, 8, 9, 4), torch.float64)
    a = pygpt.ops.attention(q, k, v, causal=False)
    b = pygpt.ops.attention(q, k, v, causal=False, scale=1.0 / math.sqrt(9))
    torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(1, 2, 1024, 1024, 32, 32), (1, 1, 1000, 1100, 32, 16),
                                   (1, 1, 1030, 1024, 16, 16)], ids=ids)
def test_long_sequence(shape, causal):
    q, k, v = make_qkv(shape, torch.float32, requires_grad=True)
    check_fwd_bwd(q, k, v, causal, None, ATTN_TOL[torch.float32], ids(shape))


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_scores_are_stable(dtype):
    # Scores of order +-100s: a kernel that exponentiates without subtracting the row max
    # overflows; rows are close to one-hot.
    q, k, v = make_qkv((1, 2, 40, 40, 16, 16), dtype)
    q = q * 12
    k = k * 12
    for causal in (True, False):
        out, lse = raw(q, k, v, causal, None)
        ref_out, ref_lse = ref.attention(*f64(q, k, v), causal=causal)
        assert torch.isfinite(out).all() and torch.isfinite(lse).all()
        close(out, ref_out, dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32
              else ATTN_TOL[dtype], "out")
        close(lse, ref_lse, dict(atol=1e-4, rtol=1e-5) if dtype == torch.float32
              else ATTN_TOL[dtype], "lse")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key(dtype):
    # causal, Tq > Tk: query i sees keys j <= i - (Tq - Tk); rows i < Tq - Tk see nothing.
    B, H, Tq, Tk, D = 2, 2, 10, 4, 8
    q, k, v = make_qkv((B, H, Tq, Tk, D, D), dtype, requires_grad=True)
    out, lse = raw(q, k, v, True, None)
    empty = Tq - Tk
    assert torch.equal(out[:, :, :empty], torch.zeros_like(out[:, :, :empty]))
    assert torch.isneginf(lse[:, :, :empty]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, empty:]).all()
    # Row `empty` sees exactly key 0, so its output is v[..., 0, :] and its lse the single score.
    torch.testing.assert_close(out[:, :, empty], v[:, :, 0].detach(), **ATTN_TOL[dtype])
    s0 = (q[:, :, empty] * k[:, :, 0]).sum(-1) / math.sqrt(D)
    torch.testing.assert_close(lse[:, :, empty], s0.detach(), **ATTN_TOL[dtype])
    out.backward(torch.randn_like(out))
    assert torch.equal(q.grad[:, :, :empty], torch.zeros_like(q.grad[:, :, :empty]))
    assert torch.isfinite(q.grad).all() and torch.isfinite(k.grad).all()
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_bottom_right_alignment(dtype):
    # With Tq < Tk the queries are the last Tq positions: a causal call on a suffix of the
    # queries must equal the matching rows of the full causal call.
    q, k, v = make_qkv((1, 2, 12, 12, 8, 8), dtype)
    full = pygpt.ops.attention(q, k, v, causal=True)
    tail = pygpt.ops.attention(q[:, :, 7:], k, v, causal=True)
    torch.testing.assert_close(tail, full[:, :, 7:], **ATTN_TOL[dtype])
    # The last query sees every key, so it matches non-causal attention.
    last = pygpt.ops.attention(q[:, :, -1:], k, v, causal=True)
    nc = pygpt.ops.attention(q[:, :, -1:], k, v, causal=False)
    torch.testing.assert_close(last, nc, **ATTN_TOL[dtype])


# ---------------------------------------------------------------------------------------------
# Against ATen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 7, 7, 16, 16), (1, 2, 33, 33, 7, 5), (2, 4, 64, 64, 32, 32),
                                   (1, 2, 256, 256, 64, 64), (2, 2, 5, 13, 8, 8),
                                   (1, 2, 40, 65, 33, 3), (1, 1, 1, 9, 8, 8)], ids=ids)
def test_vs_aten_sdpa(shape, causal, dtype):
    B, H, Tq, Tk, Dk, Dv = shape
    q, k, v = make_qkv(shape, dtype, requires_grad=True)
    aq, ak, av = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = pygpt.ops.attention(q, k, v, causal=causal)
    if causal and Tq != Tk:
        # is_causal is top-left aligned; build the bottom-right mask explicitly.
        expect = F.scaled_dot_product_attention(aq, ak, av, attn_mask=ref.causal_mask(Tq, Tk))
    else:
        expect = F.scaled_dot_product_attention(aq, ak, av, is_causal=causal)
    tol = ATTN_TOL[dtype]
    close(out, expect, tol, "out vs sdpa")
    g = torch.randn_like(out)
    out.backward(g)
    expect.backward(g)
    close(q.grad, aq.grad, tol, "dq vs sdpa")
    close(k.grad, ak.grad, tol, "dk vs sdpa")
    close(v.grad, av.grad, tol, "dv vs sdpa")


# ---------------------------------------------------------------------------------------------
# Layouts


def noncontig_qkv(B, H, Tq, Tk, Dk, Dv, dtype):
    q = torch.randn(B, Tq, H, Dk, dtype=dtype).transpose(1, 2)  # (B,T,H,D) layout
    k = torch.randn(B, H, Tk, 2 * Dk, dtype=dtype)[..., ::2]  # last-dim stride 2
    v = torch.randn(B, H, Dv, Tk, dtype=dtype).transpose(-1, -2)  # stride_d = Tk
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 17, 17, 8, 8), (1, 2, 9, 20, 12, 5), (2, 2, 40, 30, 6, 6)],
                         ids=ids)
def test_non_contiguous(shape, causal, dtype):
    q, k, v = noncontig_qkv(*shape, dtype)
    for t in (q, k, v):
        t.requires_grad_()
    check_fwd_bwd(q, k, v, causal, None, ATTN_TOL[dtype], "non-contiguous")


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_and_sliced_inputs(dtype):
    # k/v shared across heads via expand (stride 0), a batch slice with a step, and a
    # non-contiguous upstream gradient.
    B, H, T, D = 2, 4, 19, 8
    qb = torch.randn(2 * B, H, T, D, dtype=dtype)
    q = qb[::2].requires_grad_()
    k0 = torch.randn(B, 1, T, D, dtype=dtype, requires_grad=True)
    v0 = torch.randn(B, 1, T, D, dtype=dtype, requires_grad=True)
    k, v = k0.expand(B, H, T, D), v0.expand(B, H, T, D)
    out = pygpt.ops.attention(q, k, v, causal=True)
    rq, rk0, rv0 = f64(q, k0, v0)
    ref_out, _ = ref.attention(rq, rk0.expand(B, H, T, D), rv0.expand(B, H, T, D), causal=True)
    tol = ATTN_TOL[dtype]
    close(out, ref_out, tol, "out")
    g = torch.randn(B, H, D, T, dtype=dtype).transpose(-1, -2)
    out.backward(g)
    ref_out.backward(g.double())
    close(q.grad, rq.grad, tol, "dq")
    close(k0.grad, rk0.grad, tol, "dk")
    close(v0.grad, rv0.grad, tol, "dv")


def test_inputs_not_modified():
    q, k, v = make_qkv((2, 2, 9, 9, 8, 8), torch.float32, requires_grad=True)
    copies = [t.detach().clone() for t in (q, k, v)]
    out = pygpt.ops.attention(q, k, v)
    out.sum().backward()
    for t, c in zip((q, k, v), copies):
        assert torch.equal(t.detach(), c)


def test_two_threads_match_one_thread(two_threads):
    shape = (2, 3, 200, 180, 32, 24)
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        q, k, v = make_qkv(shape, torch.float32, requires_grad=True)
        out, lse = raw(q, k, v, True, None)
        out.backward(torch.randn_like(out))
        results.append((out, lse, q.grad, k.grad, v.grad))
    # Work items are independent (query tiles / (b, h) pairs), so the split must not matter.
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv"], *results):
        assert torch.equal(a, b), f"{name} differs between 1 and 2 threads"


# ---------------------------------------------------------------------------------------------
# Autograd / registration checks


GRADCHECK_CASES = [
    # (B, H, Tq, Tk, Dk, Dv, causal, scale)
    (1, 2, 3, 5, 4, 3, True, None),  # Tq < Tk causal
    (1, 2, 5, 3, 4, 3, True, None),  # Tq > Tk causal (rows with no key)
    (2, 1, 4, 4, 3, 5, True, 0.7),
    (2, 1, 4, 6, 3, 2, False, None),
    (1, 1, 1, 1, 2, 2, True, None),
    (1, 1, 35, 3, 2, 2, True, None),  # crosses a query tile
]


@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=str)
def test_gradcheck(case):
    B, H, Tq, Tk, Dk, Dv, causal, scale = case
    q, k, v = make_qkv((B, H, Tq, Tk, Dk, Dv), torch.float64, requires_grad=True)
    fn = lambda q, k, v: pygpt.ops.attention(q, k, v, causal=causal, scale=scale)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-6, rtol=1e-5)


OPCHECK_CASES = [
    ((2, 2, 7, 7, 8, 8), torch.float32, True, None, True),
    ((1, 2, 5, 9, 8, 4), torch.float32, True, 0.5, True),
    ((1, 1, 9, 5, 4, 4), torch.float64, True, None, True),
    ((2, 1, 6, 4, 3, 5), torch.float64, False, None, False),
]


@pytest.mark.parametrize("case", OPCHECK_CASES, ids=str)
def test_opcheck(case):
    shape, dtype, causal, scale, rg = case
    q, k, v = make_qkv(shape, dtype, requires_grad=rg)
    torch.library.opcheck(torch.ops.pygpt.attention.default, (q, k, v, causal, scale))
