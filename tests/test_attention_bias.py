"""Position biases inside pygpt.ops.attention (issue 14): a learned relative-position table
(rel_bias (H, 2R + 1)) and ALiBi slopes (alibi_slopes (H,)), computed by the kernels from the
key - query distance, never as a (Tq, Tk) tensor. Checked against the explicit-math reference
with an explicit (H, Tq, Tk) bias (reference.position_bias) over many shapes, causal and not,
Tq < Tk (a KV cache: queries are the last positions) and Tq > Tk, padded batches; the table's
and slopes' gradients; gradcheck in float64; opcheck; the plain-PyTorch kernel set."""

import pytest
import torch

import pygpt.ops
import reference as ref
from helpers import ATTN_TOL, DTYPES, close, f64, rand
from pygpt.ops.attention import torch_attention
from test_attention_padded import CASES, padded_grad, padded_inputs

# (B, H, Tq, Tk, Dk, Dv)
SHAPES = [
    (1, 1, 1, 1, 4, 4),  # T = 1
    (1, 2, 1, 37, 8, 8),  # one query over a cache
    (2, 3, 7, 7, 16, 8),
    (2, 2, 5, 13, 8, 8),  # Tq < Tk: queries are the last 5 positions
    (2, 2, 13, 5, 8, 8),  # Tq > Tk: causal rows 0..7 see no key
    (1, 2, 33, 33, 7, 5),  # odd sizes, just past a query tile
    (1, 3, 70, 129, 12, 20),  # several key tiles
    (1, 1, 100, 100, 32, 32),
]
# (max_distance R, rel_bias?, alibi?): R = 0 (one bucket), R smaller and larger than T.
BIASES = [(3, True, False), (0, True, False), (40, True, False), (None, False, True),
          (5, True, True)]


def ids(shape):
    return "B{}H{}Tq{}Tk{}Dk{}Dv{}".format(*shape)


def make_bias(H, R, rel, alibi, dtype, requires_grad=False):
    """A random table (H, 2R + 1) and slopes (H,) (positive, as ALiBi's), or None."""
    table = rand(H, 2 * R + 1, dtype=dtype) if rel else None
    slopes = (torch.rand(H, dtype=dtype) + 0.05) if alibi else None
    return tuple(t.requires_grad_(requires_grad) if t is not None else None
                 for t in (table, slopes))


def grad_tol(name, tol, q, k):
    """A bias gradient sums dS over up to Tq * Tk pairs (times distances up to max(Tq, Tk) for
    the slopes), terms that often nearly cancel: its absolute rounding error grows with T."""
    if not name.startswith(("dbias", "dtable", "dslopes")):
        return tol
    return dict(tol, atol=tol["atol"] * max(q.shape[2], k.shape[2]))


def check_against_reference(q, k, v, table, slopes, causal, tol, what):
    out = pygpt.ops.attention(q, k, v, causal=causal, rel_bias=table, alibi_slopes=slopes)
    inputs = [t for t in (q, k, v, table, slopes) if t is not None]
    rq, rk, rv, rt, rs = (f64(t) if t is not None else None for t in (q, k, v, table, slopes))
    bias = ref.position_bias(q.shape[2], k.shape[2], rt, rs)
    ref_out, ref_lse = ref.attention(rq, rk, rv, causal=causal, bias=bias)
    close(out, ref_out, tol, f"{what} out")
    _, lse = torch.ops.pygpt.attention(q, k, v, causal, None, None, None, table, slopes)
    close(lse, ref_lse, tol, f"{what} lse")
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, g)
    ref_inputs = [t for t in (rq, rk, rv, rt, rs) if t is not None]
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, g.double())
    for name, a, e in zip(("dq", "dk", "dv", "dbias", "dbias2"), grads, ref_grads):
        close(a, e, grad_tol(name, tol, q, k), f"{what} {name}", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", BIASES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_vs_reference(shape, bias, causal, dtype):
    B, H, Tq, Tk, Dk, Dv = shape
    q, k, v = (rand(B, H, n, d, dtype=dtype, requires_grad=True)
               for n, d in ((Tq, Dk), (Tk, Dk), (Tk, Dv)))
    table, slopes = make_bias(H, *bias, dtype, requires_grad=True)
    check_against_reference(q, k, v, table, slopes, causal, ATTN_TOL[dtype], ids(shape))


@pytest.mark.parametrize("bias", BIASES, ids=str)
def test_decode_rows_match_the_full_call(bias):
    """A KV cache: the last Tq queries over all keys give the last Tq rows of the full causal
    call (the bias uses the queries' true positions, bottom-right aligned)."""
    q, k, v = (rand(2, 3, 20, 8) for _ in range(3))
    table, slopes = make_bias(3, *bias, torch.float32)
    full = pygpt.ops.attention(q, k, v, causal=True, rel_bias=table, alibi_slopes=slopes)
    for Tq in (1, 4):
        tail = pygpt.ops.attention(q[:, :, -Tq:], k, v, causal=True, rel_bias=table,
                                   alibi_slopes=slopes)
        torch.testing.assert_close(tail, full[:, :, -Tq:], **ATTN_TOL[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_padded_vs_reference(case, causal, dtype):
    """Each row's positions come from its own lengths; the padding (NaN) is never read."""
    q, k, v, ql, kl = padded_inputs(*CASES[case], dtype, requires_grad=True)
    table, slopes = make_bias(q.shape[1], 4, True, True, dtype, requires_grad=True)
    out = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl,
                              rel_bias=table, alibi_slopes=slopes)
    rq, rk, rv, rt, rs = f64(q, k, v, table, slopes)
    ref_out, _ = ref.padded_attention(rq, rk, rv, ql, kl, causal, None, rt, rs)
    tol = ATTN_TOL[dtype]
    close(out, ref_out, tol, f"{case} out")
    g = padded_grad(out, ql)
    grads = torch.autograd.grad(out, (q, k, v, table, slopes), g)
    ref_grads = torch.autograd.grad(ref_out, (rq, rk, rv, rt, rs), torch.nan_to_num(g.double()))
    for name, a, e in zip(("dq", "dk", "dv", "dtable", "dslopes"), grads, ref_grads):
        close(a, torch.nan_to_num(e), grad_tol(name, tol, q, k), f"{case} {name}", rel_to_max=True)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("bias", BIASES, ids=str)
def test_matches_the_torch_kernel_set(bias, causal):
    """The plain-PyTorch path (kernels "torch") computes the same, padded or not."""
    for q, k, v, ql, kl in (padded_inputs(*CASES["cross-fewer-keys"], torch.float64),
                            (*(rand(2, 3, n, 8, dtype=torch.float64) for n in (6, 11, 11)),
                             None, None)):
        table, slopes = make_bias(q.shape[1], *bias, torch.float64)
        kw = dict(causal=causal, q_lengths=ql, kv_lengths=kl, rel_bias=table, alibi_slopes=slopes)
        close(pygpt.ops.attention(q, k, v, **kw), torch_attention(q, k, v, **kw),
              ATTN_TOL[torch.float64], "ext vs torch")


def test_no_bias_equals_zero_bias():
    q, k, v = (rand(2, 2, 9, 8) for _ in range(3))
    plain = pygpt.ops.attention(q, k, v)
    zero = pygpt.ops.attention(q, k, v, rel_bias=torch.zeros(2, 7),
                               alibi_slopes=torch.zeros(2))
    torch.testing.assert_close(zero, plain, atol=1e-6, rtol=1e-6)


GRADCHECK_CASES = [
    # (B, H, Tq, Tk, causal, R, rel, alibi)
    (1, 2, 3, 5, True, 2, True, True),
    (1, 2, 5, 3, True, 1, True, False),  # rows with no key
    (2, 1, 4, 4, False, 0, True, True),
    (1, 1, 35, 3, True, 3, True, True),  # crosses a query tile
    (1, 2, 4, 6, False, None, False, True),
]


@pytest.mark.parametrize("case", GRADCHECK_CASES, ids=str)
def test_gradcheck(case):
    B, H, Tq, Tk, causal, R, rel, alibi = case
    q, k, v = (rand(B, H, n, 3, dtype=torch.float64, requires_grad=True) for n in (Tq, Tk, Tk))
    table, slopes = make_bias(H, R or 0, rel, alibi, torch.float64, requires_grad=True)
    inputs = [t for t in (q, k, v, table, slopes) if t is not None]

    def fn(q, k, v, *bias):
        it = iter(bias)
        t, s = (next(it) if rel else None), (next(it) if alibi else None)
        return pygpt.ops.attention(q, k, v, causal=causal, rel_bias=t, alibi_slopes=s)

    assert torch.autograd.gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("bias", [(2, True, False), (None, False, True), (3, True, True)],
                         ids=str)
def test_opcheck(bias, lengths, dtype):
    q, k, v = (rand(2, 2, n, 4, dtype=dtype, requires_grad=True) for n in (5, 7, 7))
    table, slopes = make_bias(2, bias[0] or 0, *bias[1:], dtype, requires_grad=True)
    ql, kl = (torch.tensor([5, 2]), torch.tensor([7, 3])) if lengths else (None, None)
    torch.library.opcheck(torch.ops.pygpt.attention.default,
                          (q, k, v, True, None, ql, kl, table, slopes))
