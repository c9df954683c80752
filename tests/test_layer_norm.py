"""pygpt.ops.layer_norm / torch.ops.pygpt.layer_norm against the explicit-math reference and ATen."""

import pytest
import torch
import torch.nn.functional as F

import pygpt.ops
import reference as ref
from helpers import DTYPES, TOL, close, f64, rand

raw = torch.ops.pygpt.layer_norm

SHAPES = [
    (1,),
    (5,),  # 1-D
    (3, 1),  # C = 1
    (4, 7),
    (3, 8),
    (2, 2, 17),
    (2, 3, 33),
    (2, 3, 4, 129),  # 4-D, odd C
    (1, 768),
    (64, 384),
    (3, 5, 1000),
    (2, 2, 1, 2),
]

AFFINE = ["none", "weight", "bias", "weight+bias"]


def make(shape, dtype, affine, requires_grad=True):
    C = shape[-1]
    x = rand(*shape, dtype=dtype, requires_grad=requires_grad)
    w = rand(C, dtype=dtype, requires_grad=requires_grad) if "weight" in affine else None
    b = rand(C, dtype=dtype, requires_grad=requires_grad) if "bias" in affine else None
    return x, w, b


def check_fwd_bwd(x, w, b, eps, tol, what=""):
    y = pygpt.ops.layer_norm(x, w, b, eps)
    y2, mean, rstd = raw(x, w, b, eps)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert mean.shape == x.shape[:-1] and rstd.shape == x.shape[:-1]
    assert torch.equal(y, y2)

    rx = f64(x)
    rw = f64(w) if w is not None else None
    rb = f64(b) if b is not None else None
    ry, rmean, rrstd = ref.layer_norm(rx, rw, rb, eps)
    close(y, ry, tol, f"{what} y")
    close(mean, rmean, tol, f"{what} mean")
    close(rstd, rrstd, tol, f"{what} rstd")

    if x.requires_grad:
        g = torch.randn_like(y)
        y.backward(g)
        ry.backward(g.double())
        close(x.grad, rx.grad, tol, f"{what} dx")
        if w is not None:
            close(w.grad, rw.grad, tol, f"{what} dweight", rel_to_max=True)
        if b is not None:
            close(b.grad, rb.grad, tol, f"{what} dbias", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, affine, dtype):
    x, w, b = make(shape, dtype, affine)
    check_fwd_bwd(x, w, b, 1e-5, TOL[dtype], f"{shape} {affine}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("eps", [1e-12, 1e-3, 0.5])
def test_custom_eps(eps, dtype):
    x, w, b = make((6, 17), dtype, "weight+bias")
    check_fwd_bwd(x, w, b, eps, TOL[dtype], f"eps={eps}")


def test_default_eps():
    x, w, b = make((4, 9), torch.float64, "weight+bias", requires_grad=False)
    x = x * 1e-3  # variance ~1e-6, so eps = 1e-5 matters
    torch.testing.assert_close(pygpt.ops.layer_norm(x, w, b), pygpt.ops.layer_norm(x, w, b, 1e-5),
                               atol=0, rtol=0)
    torch.testing.assert_close(pygpt.ops.layer_norm(x, w, b), ref.layer_norm(x, w, b, 1e-5)[0],
                               **TOL[torch.float64])


@pytest.mark.parametrize("dtype", DTYPES)
def test_constant_rows(dtype):
    # Zero variance: y = bias exactly, mean = the constant, rstd = 1/sqrt(eps).
    x = torch.full((3, 10), 2.5, dtype=dtype, requires_grad=True)
    w = rand(10, dtype=dtype, requires_grad=True)
    b = rand(10, dtype=dtype, requires_grad=True)
    check_fwd_bwd(x, w, b, 1e-5, TOL[dtype], "constant rows")


def test_large_offset_float32():
    # Mean 100, std 1: a one-pass E[x^2] - E[x]^2 in float32 loses most digits of the variance.
    # ATen's float32 error here is ~6e-5 vs a float64 reference.
    x, w, b = make((256, 384), torch.float32, "weight+bias", requires_grad=False)
    x = x + 100
    y, mean, rstd = raw(x, w, b, 1e-5)
    ry, rmean, rrstd = ref.layer_norm(*f64(x, w, b))
    tol = dict(atol=2e-4, rtol=2e-4)
    close(y, ry, tol, "y")
    close(rstd, rrstd, tol, "rstd")
    close(mean, rmean, TOL[torch.float32], "mean")


# ---------------------------------------------------------------------------------------------
# Against ATen


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", [(4, 7), (2, 3, 33), (128, 768), (3, 1)], ids=str)
def test_vs_aten(shape, affine, dtype):
    x, w, b = make(shape, dtype, affine)
    ax, aw, ab = (t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b))
    y, mean, rstd = raw(x, w, b, 1e-5)
    ay, amean, arstd = torch.ops.aten.native_layer_norm(ax, [shape[-1]], aw, ab, 1e-5)
    tol = TOL[dtype]
    close(y, ay, tol, "y vs aten")
    close(mean, amean.reshape(mean.shape), tol, "mean vs aten")
    close(rstd, arstd.reshape(rstd.shape), tol, "rstd vs aten")
    y = pygpt.ops.layer_norm(x, w, b)
    ay = F.layer_norm(ax, (shape[-1],), aw, ab)
    g = torch.randn_like(y)
    y.backward(g)
    ay.backward(g)
    close(x.grad, ax.grad, tol, "dx vs aten")
    if w is not None:
        close(w.grad, aw.grad, tol, "dweight vs aten", rel_to_max=True)
    if b is not None:
        close(b.grad, ab.grad, tol, "dbias vs aten", rel_to_max=True)


# ---------------------------------------------------------------------------------------------
# Layouts


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "strided_params", "expanded"])
def test_non_contiguous(layout, dtype):
    N, C = 13, 21
    w = rand(C, dtype=dtype)
    b = rand(C, dtype=dtype)
    if layout == "transposed":
        x = torch.randn(C, N, dtype=dtype).t()
    elif layout == "sliced":
        x = torch.randn(N, 2 * C + 1, dtype=dtype)[:, 1::2]
    elif layout == "strided_params":
        x = torch.randn(2, N, C, dtype=dtype)[:, ::2]
        w = torch.randn(2 * C, dtype=dtype)[::2]
        b = torch.randn(3 * C, dtype=dtype)[1::3]
    else:  # same row repeated with stride 0
        x = torch.randn(1, C, dtype=dtype).expand(N, C)
    assert not x.is_contiguous() or not w.is_contiguous()
    for t in (x, w, b):
        t.requires_grad_()
    check_fwd_bwd(x, w, b, 1e-5, TOL[dtype], layout)


def test_non_contiguous_grad_output():
    x, w, b = make((11, 16), torch.float64, "weight+bias")
    y = pygpt.ops.layer_norm(x, w, b)
    g = torch.randn(16, 11, dtype=torch.float64).t()
    y.backward(g)
    rx, rw, rb = f64(x, w, b)
    ry, _, _ = ref.layer_norm(rx, rw, rb)
    ry.backward(g)
    for a, e, n in [(x.grad, rx.grad, "dx"), (w.grad, rw.grad, "dw"), (b.grad, rb.grad, "db")]:
        close(a, e, TOL[torch.float64], n)


def test_inputs_not_modified():
    x, w, b = make((7, 9), torch.float32, "weight+bias")
    copies = [t.detach().clone() for t in (x, w, b)]
    pygpt.ops.layer_norm(x, w, b).sum().backward()
    for t, c in zip((x, w, b), copies):
        assert torch.equal(t.detach(), c)


def test_two_threads_match_one_thread(two_threads):
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        x, w, b = make((1000, 257), torch.float32, "weight+bias")
        y, mean, rstd = raw(x, w, b, 1e-5)
        y.backward(torch.randn_like(y))
        results.append((y, mean, rstd, x.grad, w.grad, b.grad))
    # Rows are independent: bitwise equal. dweight/dbias are sums over rows whose order may depend
    # on the split, so only close.
    for name, a, b in zip(["y", "mean", "rstd", "dx"], results[0][:4], results[1][:4]):
        assert torch.equal(a, b), f"{name} differs between 1 and 2 threads"
    for name, a, b in zip(["dweight", "dbias"], results[0][4:], results[1][4:]):
        close(a, b, TOL[torch.float32], name, rel_to_max=True)


# ---------------------------------------------------------------------------------------------
# Autograd / registration checks


@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4), (4, 1), (6,)], ids=str)
def test_gradcheck(shape, affine):
    x, w, b = make(shape, torch.float64, affine)
    inputs = tuple(t for t in (x, w, b) if t is not None)

    def fn(*ts):
        ts = list(ts)
        x = ts.pop(0)
        w = ts.pop(0) if "weight" in affine else None
        b = ts.pop(0) if "bias" in affine else None
        return pygpt.ops.layer_norm(x, w, b, 1e-5)

    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", [
    ((5, 8), torch.float32, "weight+bias", True),
    ((2, 3, 7), torch.float64, "none", True),
    ((4, 6), torch.float64, "weight", True),
    ((6,), torch.float32, "bias", False),
], ids=str)
def test_opcheck(case):
    shape, dtype, affine, rg = case
    x, w, b = make(shape, dtype, affine, requires_grad=rg)
    torch.library.opcheck(torch.ops.pygpt.layer_norm.default, (x, w, b, 1e-5))
