"""pygpt.ops.attention on right-padded batches (per-row q_lengths / kv_lengths) against the
explicit-math reference that runs each row alone on its real prefix (reference.padded_attention),
and against the plain-PyTorch path. The padding of every input is filled with NaN: nothing it
holds may reach a result, padded outputs are exactly zero and padded gradients exactly zero."""

import pytest
import torch

import pygpt.ops
import reference as ref
from helpers import ATTN_TOL, DTYPES, close, f64, rand
from pygpt.ops.attention import torch_attention

raw = torch.ops.pygpt.attention

# (H, Tq, Tk, Dk, Dv, q_lengths, kv_lengths): lengths 0, 1 and full, every row different.
CASES = {
    "self": (2, 37, 37, 16, 24, [37, 1, 0, 20], [37, 1, 0, 20]),
    "self-tiles": (1, 70, 70, 8, 8, [64, 33, 65, 70, 31], [64, 33, 65, 70, 31]),
    "cross-longer-keys": (3, 12, 130, 7, 5, [12, 3, 0, 12], [130, 65, 9, 0]),
    "cross-fewer-keys": (2, 40, 9, 8, 8, [40, 17, 5, 1], [9, 3, 9, 1]),  # causal: keyless rows
    "decode-step": (2, 1, 100, 32, 32, [1, 1, 0], [100, 7, 50]),
    "one-key": (1, 100, 1, 16, 16, [100, 50], [1, 1]),
    "dk-ne-dv": (2, 33, 33, 5, 12, [33, 32, 1], [33, 32, 1]),
}


def padded_inputs(H, Tq, Tk, Dk, Dv, lq, lk, dtype, length_dtype=torch.int64,
                  requires_grad=False):
    """q, k, v with NaN in every padded position, and the lengths (lists lq, lk: one per row)."""
    B = len(lq)
    q_lengths, kv_lengths = torch.tensor(lq, dtype=length_dtype), torch.tensor(lk, dtype=length_dtype)
    tensors = []
    for T, D, lengths in ((Tq, Dk, lq), (Tk, Dk, lk), (Tk, Dv, lk)):
        x = rand(B, H, T, D, dtype=dtype)
        for b, n in enumerate(lengths):
            x[b, :, n:] = float("nan")
        tensors.append(x.requires_grad_(requires_grad))
    return (*tensors, q_lengths, kv_lengths)


def make(case, dtype, length_dtype=torch.int64, requires_grad=False):
    return padded_inputs(*CASES[case], dtype, length_dtype, requires_grad)


def padded_grad(out, q_lengths):
    """A random upstream gradient, NaN in the padded query rows (the op must never read them)."""
    g = torch.randn_like(out)
    for b, n in enumerate(q_lengths.tolist()):
        g[b, :, n:] = float("nan")
    return g


def assert_padding_zero(t, lengths, what):
    """t (B, H, T, D): finite everywhere, exactly zero past each row's length."""
    assert not t.isnan().any(), f"{what} has NaN"
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(t[b, :, n:] == 0), f"{what}: row {b} padding is not zero"


@pytest.mark.parametrize("length_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_vs_reference(case, causal, dtype, length_dtype):
    q, k, v, ql, kl = make(case, dtype, length_dtype, requires_grad=True)
    out = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
    _, lse = raw(q, k, v, causal, None, ql, kl)
    rq, rk, rv = f64(q, k, v)
    ref_out, ref_lse = ref.padded_attention(rq, rk, rv, ql, kl, causal)
    tol = ATTN_TOL[dtype]
    close(out, ref_out, tol, f"{case} out")
    close(lse, ref_lse, tol, f"{case} lse")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "lse -inf rows differ"
    assert_padding_zero(out, ql, "out")

    g = padded_grad(out, ql)
    grads = torch.autograd.grad(out, (q, k, v), g)
    ref_grads = torch.autograd.grad(ref_out, (rq, rk, rv), g.double().nan_to_num(),
                                    allow_unused=True, materialize_grads=True)
    for name, got, want, lengths in zip("qkv", grads, ref_grads, (ql, kl, kl)):
        close(got, want.nan_to_num(), tol, f"{case} d{name}")  # the reference's NaN padding
        assert_padding_zero(got, lengths, f"d{name}")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_torch_path(case, causal):
    """The plain-PyTorch kernel set (SDPA with a mask built from the lengths) agrees, NaN padding
    and all, so models on either kernel set handle padding alike."""
    q, k, v, ql, kl = make(case, torch.float64, requires_grad=True)
    out = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
    expected = torch_attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
    close(out, expected, ATTN_TOL[torch.float64], f"{case} out")
    g = padded_grad(out, ql).nan_to_num()
    for got, want in zip(torch.autograd.grad(out, (q, k, v), g),
                         torch.autograd.grad(expected, (q, k, v), g)):
        close(got, want, ATTN_TOL[torch.float64], f"{case} grad")


@pytest.mark.parametrize("causal", [True, False])
def test_full_lengths_are_no_lengths(causal):
    """Lengths equal to Tq and Tk give bit for bit the result of no lengths at all."""
    q, k, v = rand(3, 2, 21, 16), rand(3, 2, 45, 16), rand(3, 2, 45, 8)
    for t in (q, k, v):
        t.requires_grad_(True)
    full = torch.full((3,), 21), torch.full((3,), 45)
    a = pygpt.ops.attention(q, k, v, causal=causal)
    b = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=full[0], kv_lengths=full[1])
    assert torch.equal(a, b)
    g = torch.randn_like(a)
    for x, y in zip(torch.autograd.grad(a, (q, k, v), g), torch.autograd.grad(b, (q, k, v), g)):
        assert torch.equal(x, y)


@pytest.mark.parametrize("causal", [True, False])
def test_a_row_alone_equals_the_row_in_a_padded_batch(causal):
    """Padding invariance: each row's real part gives the same output as that row run alone
    without lengths (same tiles, same arithmetic: equal to the last bit)."""
    q, k, v, ql, kl = make("self-tiles", torch.float32)
    out = pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl)
    for b, (nq, nk) in enumerate(zip(ql.tolist(), kl.tolist())):
        alone = pygpt.ops.attention(q[b:b + 1, :, :nq], k[b:b + 1, :, :nk], v[b:b + 1, :, :nk],
                                    causal=causal)
        assert torch.equal(out[b:b + 1, :, :nq], alone), f"row {b}"


def test_only_kv_lengths_or_only_q_lengths():
    """One of the two alone: the other is taken as full."""
    q, k, v, ql, kl = make("cross-longer-keys", torch.float64)
    full_q = torch.full_like(ql, q.shape[2])
    q_ok = torch.where(torch.isnan(q), 0.0, q)  # with all queries real, q's padding is data
    a = pygpt.ops.attention(q_ok, k, v, causal=False, kv_lengths=kl)
    b = pygpt.ops.attention(q_ok, k, v, causal=False, q_lengths=full_q, kv_lengths=kl)
    assert torch.equal(a, b)
    k_ok, v_ok = (torch.where(torch.isnan(t), 0.0, t) for t in (k, v))
    c = pygpt.ops.attention(q, k_ok, v_ok, causal=True, q_lengths=ql)
    d = pygpt.ops.attention(q, k_ok, v_ok, causal=True, q_lengths=ql,
                            kv_lengths=torch.full_like(kl, k.shape[2]))
    assert torch.equal(c, d)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", ["cross-fewer-keys", "dk-ne-dv"])
def test_gradcheck(case, causal):
    H, Tq, Tk, Dk, Dv, lq, lk = CASES[case]
    B = len(lq)
    small = dict(H=1, Tq=min(Tq, 7), Tk=min(Tk, 6))  # gradcheck is O(elements^2)
    ql = torch.tensor([min(n, small["Tq"]) for n in lq])
    kl = torch.tensor([min(n, small["Tk"]) for n in lk])
    q = rand(B, 1, small["Tq"], Dk, dtype=torch.float64, requires_grad=True)
    k = rand(B, 1, small["Tk"], Dk, dtype=torch.float64, requires_grad=True)
    v = rand(B, 1, small["Tk"], Dv, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v: pygpt.ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl),
        (q, k, v))


@pytest.mark.parametrize("length_dtype", [torch.int64, torch.int32])
def test_opcheck(length_dtype):
    # Finite padding here: opcheck's own comparisons do not expect NaN inputs.
    q, k, v, ql, kl = make("cross-longer-keys", torch.float64, length_dtype)
    q, k, v = (t.nan_to_num(1.5).requires_grad_(True) for t in (q, k, v))
    torch.library.opcheck(raw.default, (q, k, v, True, None, ql, kl))
    torch.library.opcheck(raw.default, (q, k, v, False, 0.5, None, kl))
