"""pygpt.ops.bias_gelu / torch.ops.pygpt.bias_gelu against F.gelu(x + bias, approximate=...) in
float64, for the exact GELU and its tanh approximation: values and gradients over many shapes,
gradcheck, opcheck, special values, layouts, threads, and the MLP that uses it (bad inputs:
tests/test_op_contract.py)."""

import math

import pytest
import torch
import torch.nn.functional as F

import pygpt.ops
from helpers import DTYPES, TOL, close, f64, rand, spread_
from pygpt.nn import MLP
from pygpt.ops.bias_gelu import ext_linear_gelu, torch_linear_gelu

APPROXIMATIONS = ["none", "tanh"]  # F.gelu's: the exact (erf) GELU and its tanh approximation
SHAPES = [(1,), (7,), (3, 1), (1, 5), (4, 7), (2, 3, 33), (2, 3, 4, 129), (12, 64, 512),
          (3, 1000), (2, 4099)]


def check_fwd_bwd(x, b, tol, what="", approximate="none"):
    y = pygpt.ops.bias_gelu(x, b, approximate)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    rx, rb = f64(x, b)
    ry = F.gelu(rx + rb, approximate=approximate)  # the float64 reference, differentiable
    close(y, ry, tol, f"{what} y")
    g = torch.randn_like(y)
    y.backward(g)
    ry.backward(g.double())
    close(x.grad, rx.grad, tol, f"{what} dx")
    if b.requires_grad:
        close(b.grad, rb.grad, tol, f"{what} dbias", rel_to_max=True)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, dtype, approximate):
    # scale 3: the tails (|h| up to ~15), where 1 + erf(h / sqrt 2) and 1 + tanh(u) cancel, are
    # covered too.
    x = rand(*shape, dtype=dtype, requires_grad=True, scale=3.0)
    b = rand(shape[-1], dtype=dtype, requires_grad=True)
    check_fwd_bwd(x, b, TOL[dtype], str(shape), approximate)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_vs_aten_gelu(dtype, approximate):
    """Against ATen's own float32 / float64 GELU of the same sum (not only the float64 one),
    values and gradients."""
    x = rand(64, 300, dtype=dtype, scale=4.0, requires_grad=True)
    b = rand(300, dtype=dtype, requires_grad=True)
    y = pygpt.ops.bias_gelu(x, b, approximate)
    expected = F.gelu(x + b, approximate=approximate)
    close(y, expected, TOL[dtype], "vs F.gelu")
    g = rand(64, 300, dtype=dtype)
    got, want = torch.autograd.grad(y, (x, b), g), torch.autograd.grad(expected, (x, b), g)
    close(got[0], want[0], TOL[dtype], "dx vs F.gelu's")
    close(got[1], want[1], TOL[dtype], "dbias vs F.gelu's", rel_to_max=True)


def test_tanh_is_the_formula_and_not_the_exact_gelu():
    """The tanh GELU as its formula, 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))), and as
    far from the exact GELU as that is (so the two are not mixed up)."""
    x, b = rand(8, 50, dtype=torch.float64, scale=2.0), rand(50, dtype=torch.float64)
    h = x + b
    formula = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    y = pygpt.ops.bias_gelu(x, b, "tanh")
    close(y, formula, TOL[torch.float64], "tanh GELU formula")
    assert (y - pygpt.ops.bias_gelu(x, b)).abs().max() > 1e-4


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_gradcheck_float64(approximate):
    x = rand(4, 9, dtype=torch.float64, requires_grad=True, scale=2.0)
    b = rand(9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, b: pygpt.ops.bias_gelu(x, b, approximate), (x, b))


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 8), (1, 1)], ids=str)
def test_opcheck(shape, dtype, approximate):
    x = rand(*shape, dtype=dtype, requires_grad=True)
    b = rand(shape[-1], dtype=dtype, requires_grad=True)
    torch.library.opcheck(torch.ops.pygpt.bias_gelu.default, (x, b, approximate))
    g = rand(*shape, dtype=dtype)
    for bias_grad in (True, False):
        torch.library.opcheck(torch.ops.pygpt.bias_gelu_backward.default,
                              (g, x.detach(), b.detach(), bias_grad, approximate))


def test_the_approximation_defaults_to_the_exact_gelu():
    x, b, g = rand(5, 6), rand(6), rand(5, 6)
    assert torch.equal(torch.ops.pygpt.bias_gelu(x, b), torch.ops.pygpt.bias_gelu(x, b, "none"))
    for got, want in zip(torch.ops.pygpt.bias_gelu_backward(g, x, b, True),
                         torch.ops.pygpt.bias_gelu_backward(g, x, b, True, "none")):
        assert torch.equal(got, want)


@pytest.mark.parametrize("approximate", ["", "erf", "Tanh", "sigmoid"])
def test_unknown_approximation_is_refused_in_one_line(approximate):
    """Forward, backward and the fake (a meta tensor) name the argument and the choices."""
    x, b = rand(3, 4), rand(4)
    message = f"approximate must be 'none' or 'tanh', got '{approximate}'"
    calls = [lambda: pygpt.ops.bias_gelu(x, b, approximate),
             lambda: torch.ops.pygpt.bias_gelu_backward(x, x, b, True, approximate),
             lambda: torch.ops.pygpt.bias_gelu(x.to("meta"), b.to("meta"), approximate),
             lambda: torch.ops.pygpt.bias_gelu_backward(x.to("meta"), x.to("meta"), b.to("meta"),
                                                        False, approximate)]
    for call in calls:
        with pytest.raises(RuntimeError, match=message) as caught:
            call()
        assert "\n" not in str(caught.value).split("approximate must")[1]


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_special_values(dtype, approximate):
    """NaN propagates; gelu(+inf) = +inf and gelu(-inf) = -inf * 0 = NaN (ATen's float32 exact
    GELU gives NaN for both); huge, zero and tiny values as the float64 GELU."""
    x = torch.tensor([[math.nan, math.inf, -math.inf]], dtype=dtype)
    y = pygpt.ops.bias_gelu(x, torch.zeros(3, dtype=dtype), approximate)
    assert y[0, 0].isnan() and y[0, 1] == math.inf and y[0, 2].isnan()
    x = torch.tensor([[50.0, -50.0, 0.0, -0.0, 1e-30, -1e-30, 4.0, -4.0, 5.7, -5.7, 9.0, -9.0,
                       10.5, -10.5, 12.0, -12.0]], dtype=dtype, requires_grad=True)
    b = torch.zeros(x.shape[-1], dtype=dtype)
    y = pygpt.ops.bias_gelu(x, b, approximate)
    x64 = x.detach().double().requires_grad_()
    expected = F.gelu(x64, approximate=approximate)
    close(y, expected, TOL[dtype], "special values")
    (dx,), (dx64,) = torch.autograd.grad(y.sum(), x), torch.autograd.grad(expected.sum(), x64)
    close(dx, dx64, TOL[dtype], "special values' gradients")


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_bias_without_grad_and_raw_backward_flags(approximate):
    x = rand(5, 6, requires_grad=True)
    b = rand(6)  # no grad wanted
    check_fwd_bwd(x, b, TOL[torch.float32], "bias without grad", approximate)
    g = rand(5, 6)
    dx, dbias = torch.ops.pygpt.bias_gelu_backward(g, x.detach(), b, False, approximate)
    assert dbias.shape == (0,)
    dx2, dbias2 = torch.ops.pygpt.bias_gelu_backward(g, x.detach(), b, True, approximate)
    assert torch.equal(dx, dx2) and dbias2.shape == (6,)
    close(dbias2, dx2.sum(0), TOL[torch.float32], "dbias = column sums of dx", rel_to_max=True)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "strided_bias", "expanded"])
def test_non_contiguous(layout, dtype, approximate):
    N, C = 13, 21
    b = rand(C, dtype=dtype)
    if layout == "transposed":
        x = torch.randn(C, N, dtype=dtype).t()
    elif layout == "sliced":
        x = torch.randn(N, 2 * C + 1, dtype=dtype)[:, 1::2]
    elif layout == "strided_bias":
        x = torch.randn(N, C, dtype=dtype)
        b = torch.randn(3 * C, dtype=dtype)[1::3]
    else:  # the same row repeated with stride 0
        x = torch.randn(1, C, dtype=dtype).expand(N, C)
    assert not x.is_contiguous() or not b.is_contiguous()
    check_fwd_bwd(x.requires_grad_(), b.requires_grad_(), TOL[dtype], layout, approximate)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_empty_rows(approximate):
    x, b = rand(0, 5, requires_grad=True), rand(5, requires_grad=True)
    y = pygpt.ops.bias_gelu(x, b, approximate)
    assert y.shape == (0, 5)
    y.sum().backward()
    assert torch.equal(b.grad, torch.zeros(5)) and x.grad.shape == (0, 5)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_two_threads_match_one_thread(two_threads, approximate):
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        x, b = rand(1000, 257, requires_grad=True), rand(257, requires_grad=True)
        y = pygpt.ops.bias_gelu(x, b, approximate)
        y.backward(torch.randn_like(y))
        results.append((y, x.grad, b.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
    close(results[0][2], results[1][2], TOL[torch.float32], "dbias", rel_to_max=True)


@pytest.mark.parametrize("approximate", APPROXIMATIONS)
def test_reproducible_run_to_run(approximate):
    x, b = rand(300, 64, requires_grad=True), rand(64, requires_grad=True)
    g = torch.randn(300, 64)
    grads = []
    for _ in range(2):
        x.grad = b.grad = None
        pygpt.ops.bias_gelu(x, b, approximate).backward(g)
        grads.append((x.grad.clone(), b.grad.clone()))
    assert all(torch.equal(a, c) for a, c in zip(*grads))


def test_kernel_sets_linear_gelu():
    x, b = rand(4, 6, dtype=torch.float64), rand(6, dtype=torch.float64)
    eye = torch.eye(6, dtype=torch.float64)

    def tanh_gelu(h):  # h * sigmoid(2u), the tanh GELU written another way
        return h * torch.sigmoid(2 * math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3))

    for linear_gelu in (ext_linear_gelu, torch_linear_gelu):
        close(linear_gelu(x, eye, b), x + b - (x + b) * torch.special.ndtr(-(x + b)),
              TOL[torch.float64], "gelu(h) = h - h * Phi(-h)")
        close(linear_gelu(x, eye, None), x - x * torch.special.ndtr(-x), TOL[torch.float64],
              "without a bias")
        close(linear_gelu(x, eye, b, "tanh"), tanh_gelu(x + b), TOL[torch.float64], "tanh")
        close(linear_gelu(x, eye, None, "tanh"), tanh_gelu(x), TOL[torch.float64],
              "tanh without a bias")


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_mlp_fuses_bias_and_gelu(kernels, activation):
    """The MLP with either GELU and biases: fused through the kernel set, the same parameters
    and state dict names, and the values and gradients of the unfused composition; ReLU or no
    bias: unfused."""
    approximate = {"gelu": "none", "gelu_tanh": "tanh"}[activation]
    torch.manual_seed(0)
    mlp = spread_(MLP(8, 24, activation=activation))
    mlp.kernels = kernels
    assert mlp.gelu and list(mlp.state_dict()) == ["fc.weight", "fc.bias",
                                                   "proj.weight", "proj.bias"]
    x = rand(3, 4, 8, dtype=torch.float64, scale=2.0)
    mlp64 = MLP(8, 24).double()
    mlp64.load_state_dict(mlp.state_dict())
    x32 = x.float().requires_grad_()
    out = mlp(x32)
    x64 = x.clone().requires_grad_()
    expected = mlp64.proj(F.gelu(mlp64.fc(x64), approximate=approximate))
    close(out, expected, TOL[torch.float32], "mlp", rel_to_max=True)
    g = rand(3, 4, 8)
    out.backward(g)
    expected.backward(g.double())
    close(x32.grad, x64.grad, TOL[torch.float32], "mlp dx", rel_to_max=True)
    for name, p in mlp.named_parameters():
        close(p.grad, dict(mlp64.named_parameters())[name].grad, TOL[torch.float32],
              f"mlp d{name}", rel_to_max=True)
    assert not MLP(8, 24, activation="relu").gelu
