"""The CUDA fused ops (bias_gelu, add_layer_norm) against the CPU ops as the oracle, forward and
backward, in float32 (tight), bfloat16 and float16 (inputs rounded to the 16-bit type for both
sides; a few of its ulps expected), opcheck on CUDA, and clear errors for bad input. Skipped where no GPU
is present (as tests/test_cuda.py)."""
import pytest
import torch

import pygpt.ops as ops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=1e-2, rtol=1e-2)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
SHAPES = [(1, 1), (3, 7), (768, 128), (768, 512), (64, 4096), (5, 3, 127), (2, 16392)]


def _pair(*shapes, dtype, scale=1.0):
    """The same random inputs on the CPU (float32, from the dtype-rounded values) and on CUDA."""
    cuda = [(torch.randn(*s) * scale).to(dtype).cuda().requires_grad_() for s in shapes]
    cpu = [t.detach().float().cpu().requires_grad_() for t in cuda]
    return cpu, cuda


def _close(actual, expected, dtype, what, sum_rows=1):
    """sum_rows: results summed over that many rows (parameter gradients) get a wider atol."""
    tol = dict(TOL[dtype], atol=TOL[dtype]["atol"] * max(1.0, sum_rows ** 0.5))
    torch.testing.assert_close(actual.float().cpu(), expected.float(), equal_nan=True,
                               msg=lambda m: f"{what} ({dtype}): {m}", **tol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_bias_gelu_matches_cpu(shape, dtype, approximate):
    (x, b), (xc, bc) = _pair(shape, shape[-1:], dtype=dtype, scale=3.0)
    y, yc = ops.bias_gelu(x, b, approximate), ops.bias_gelu(xc, bc, approximate)
    assert yc.dtype == dtype
    _close(yc, y, dtype, "y")
    grad = torch.randn_like(y).to(dtype)
    y.backward(grad.float())
    yc.backward(grad.cuda())
    _close(xc.grad, x.grad, dtype, "dx")
    _close(bc.grad, b.grad, dtype, "dbias", sum_rows=x.numel() // shape[-1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_layer_norm_matches_cpu(shape, affine, dtype):
    C = shape[-1]
    (x, r, w, b), (xc, rc, wc, bc) = _pair(shape, shape, (C,), (C,), dtype=dtype)
    if not affine:
        w = b = wc = bc = None
    s, y = ops.add_layer_norm(x, r, w, b)
    sc, yc = ops.add_layer_norm(xc, rc, wc, bc)
    # The CPU sum in float32 rounded to dtype is the device's sum exactly; the CPU norm then
    # normalises the unrounded float32 sum, which the tolerance covers for bfloat16.
    assert torch.equal(sc.float().cpu(), s.detach().to(dtype).float())
    _close(yc, y, dtype, "y")
    gs, gy = torch.randn_like(s).to(dtype), torch.randn_like(y).to(dtype)
    torch.autograd.backward([s, y], [gs.float(), gy.float()])
    torch.autograd.backward([sc, yc], [gs.cuda(), gy.cuda()])
    _close(xc.grad, x.grad, dtype, "dx")
    _close(rc.grad, r.grad, dtype, "dresidual")
    if affine:
        rows = x.numel() // C
        _close(wc.grad, w.grad, dtype, "dweight", sum_rows=rows)
        _close(bc.grad, b.grad, dtype, "dbias", sum_rows=rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_on_cuda(dtype):
    x = torch.randn(4, 16, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(4, 16, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(16, device="cuda", dtype=dtype, requires_grad=True)
    for approximate in ("none", "tanh"):
        torch.library.opcheck(torch.ops.pygpt.bias_gelu.default, (x, w, approximate))
    torch.library.opcheck(torch.ops.pygpt.add_layer_norm.default, (x, r, w, w, 1e-5))


def test_bad_input_on_cuda():
    x = torch.randn(3, 8, device="cuda")
    with pytest.raises(RuntimeError, match="x must be float32, bfloat16 or float16 on CUDA"):
        torch.ops.pygpt.bias_gelu(x.double(), torch.zeros(8, device="cuda").double())  # raw op
    with pytest.raises(RuntimeError, match=r"\bbias\b.*cpu|device"):
        ops.bias_gelu(x, torch.zeros(8))
    with pytest.raises(RuntimeError, match=r"\bresidual\b.*shape"):
        ops.add_layer_norm(x, torch.randn(3, 7, device="cuda"))
