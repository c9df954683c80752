"""pygpt.ops.add_layer_norm / torch.ops.pygpt.add_layer_norm against x + residual and the
explicit-math layer norm in float64: both outputs and the gradients of x, residual, weight and
bias with gradients into either or both outputs; gradcheck, opcheck, layouts, threads; and the
transformer blocks that use it (bad inputs: tests/test_op_contract.py)."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import pygpt.ops
import reference as ref
from helpers import DTYPES, TINY, TOL, close, f64, make_model, rand, rand_tokens
from pygpt.ops.add_layer_norm import torch_add_layer_norm

raw = torch.ops.pygpt.add_layer_norm

SHAPES = [(1,), (5,), (3, 1), (1, 7), (4, 7), (2, 3, 33), (2, 3, 4, 129), (12, 64, 128),
          (3, 5, 1000), (2, 4099)]
AFFINE = ["none", "weight", "bias", "weight+bias"]
OUTPUTS = ["both", "norm", "sum"]  # which outputs the loss uses


def make(shape, dtype, affine, requires_grad=True):
    C = shape[-1]
    x = rand(*shape, dtype=dtype, requires_grad=requires_grad)
    r = rand(*shape, dtype=dtype, requires_grad=requires_grad, scale=2.0)
    w = rand(C, dtype=dtype, requires_grad=requires_grad) if "weight" in affine else None
    b = rand(C, dtype=dtype, requires_grad=requires_grad) if "bias" in affine else None
    return x, r, w, b


def backward(s, y, outputs, gs, gy):
    used = {"both": ([s, y], [gs, gy]), "norm": ([y], [gy]), "sum": ([s], [gs])}[outputs]
    torch.autograd.backward(*used)


def check_fwd_bwd(x, r, w, b, eps, tol, outputs="both", what=""):
    s, y = pygpt.ops.add_layer_norm(x, r, w, b, eps)
    s2, y2, mean, rstd = raw(x, r, w, b, eps)
    assert s.shape == y.shape == x.shape and mean.shape == rstd.shape == x.shape[:-1]
    assert torch.equal(s, s2) and torch.equal(y, y2)
    assert torch.equal(s, x + r), "the sum is the plain float sum"
    rx, rr = f64(x, r)
    rw = f64(w) if w is not None else None
    rb = f64(b) if b is not None else None
    rs = rx + rr
    ry, rmean, rrstd = ref.layer_norm(rs, rw, rb, eps)
    close(y, ry, tol, f"{what} y")
    close(mean, rmean, tol, f"{what} mean")
    close(rstd, rrstd, tol, f"{what} rstd")
    gs, gy = torch.randn_like(s), torch.randn_like(y)
    backward(s, y, outputs, gs, gy)
    backward(rs, ry, outputs, gs.double(), gy.double())
    # float32 rounding in the norm's backward scales with rstd: 316 for a row of one element
    # (zero variance, 1 / sqrt(eps)), as in ATen's and our plain layer norm.
    dx_tol = dict(tol, atol=tol["atol"] * max(1.0, rrstd.max().item()))
    close(x.grad, rx.grad, dx_tol, f"{what} dx")
    close(r.grad, rr.grad, dx_tol, f"{what} dresidual")
    if w is not None and outputs != "sum":
        close(w.grad, rw.grad, tol, f"{what} dweight", rel_to_max=True)
    if b is not None and outputs != "sum":
        close(b.grad, rb.grad, tol, f"{what} dbias", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, affine, dtype):
    check_fwd_bwd(*make(shape, dtype, affine), 1e-5, TOL[dtype], what=f"{shape} {affine}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("outputs", OUTPUTS)
def test_gradient_through_either_output(outputs, dtype):
    check_fwd_bwd(*make((6, 33), dtype, "weight+bias"), 1e-5, TOL[dtype], outputs, outputs)


@pytest.mark.parametrize("eps", [1e-12, 0.5])
def test_custom_eps(eps):
    check_fwd_bwd(*make((6, 17), torch.float64, "weight+bias"), eps, TOL[torch.float64])


@pytest.mark.parametrize("affine", AFFINE)
def test_gradcheck_float64(affine):
    x, r, w, b = make((3, 7), torch.float64, affine)
    inputs = tuple(t for t in (x, r, w, b) if t is not None)

    def f(x, r, *params):
        it = iter(params)
        w_, b_ = (next(it) if w is not None else None), (next(it) if b is not None else None)
        return pygpt.ops.add_layer_norm(x, r, w_, b_)

    assert torch.autograd.gradcheck(f, inputs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", AFFINE)
def test_opcheck(affine, dtype):
    x, r, w, b = make((3, 2, 8), dtype, affine)
    torch.library.opcheck(raw.default, (x, r, w, b, 1e-5))
    s, _, mean, rstd = raw(*(t.detach() if t is not None else None for t in (x, r, w, b)), 1e-5)
    g = rand(3, 2, 8, dtype=dtype)
    wd = w.detach() if w is not None else None
    for grad_sum in (g, None):
        torch.library.opcheck(torch.ops.pygpt.add_layer_norm_backward.default,
                              (g, grad_sum, s, wd, mean, rstd, w is not None, b is not None))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["transposed", "sliced", "expanded_residual"])
def test_non_contiguous(layout, dtype):
    N, C = 13, 21
    w, b = rand(C, dtype=dtype), rand(C, dtype=dtype)
    if layout == "transposed":
        x, r = torch.randn(C, N, dtype=dtype).t(), torch.randn(N, C, dtype=dtype)
    elif layout == "sliced":
        x = torch.randn(N, 2 * C + 1, dtype=dtype)[:, 1::2]
        r = torch.randn(N, 3 * C, dtype=dtype)[:, ::3]
    else:
        x, r = torch.randn(N, C, dtype=dtype), torch.randn(1, C, dtype=dtype).expand(N, C)
    for t in (x, r, w, b):
        t.requires_grad_()
    check_fwd_bwd(x, r, w, b, 1e-5, TOL[dtype], what=layout)


def test_empty_rows():
    x, r, w, b = make((0, 5), torch.float32, "weight+bias")
    s, y = pygpt.ops.add_layer_norm(x, r, w, b)
    (s.sum() + y.sum()).backward()
    assert s.shape == y.shape == (0, 5)
    assert torch.equal(w.grad, torch.zeros(5)) and torch.equal(b.grad, torch.zeros(5))


def test_two_threads_match_one_thread(two_threads):
    results = []
    for on in (False, True):
        two_threads(on)
        torch.manual_seed(1)
        x, r, w, b = make((1000, 257), torch.float32, "weight+bias")
        s, y = pygpt.ops.add_layer_norm(x, r, w, b)
        torch.autograd.backward([s, y], [torch.randn_like(s), torch.randn_like(y)])
        results.append((s, y, x.grad, w.grad, b.grad))
    for name, a, c in zip(["sum", "y", "dx"], results[0][:3], results[1][:3]):
        assert torch.equal(a, c), f"{name} differs between 1 and 2 threads"
    for name, a, c in zip(["dweight", "dbias"], results[0][3:], results[1][3:]):
        close(a, c, TOL[torch.float32], name, rel_to_max=True)


def test_torch_kernel_set_reference():
    x, r, w, b = make((4, 6), torch.float64, "weight+bias", requires_grad=False)
    s, y = torch_add_layer_norm(x, r, w, b)
    close(s, x + r, TOL[torch.float64], "sum")
    close(y, ref.layer_norm(x + r, w, b)[0], TOL[torch.float64], "norm")


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("norm, add_ln, ln", [("pre", 1, 1), ("post", 2, 0)])
def test_blocks_fuse_add_and_norm(norm, add_ln, ln):
    """A pre-norm block normalises its input and fuses the attention's residual add with the
    MLP's norm; a post-norm block fuses both of its Add & Norms. The ext and torch kernel sets
    agree on the model's logits and gradients."""
    import dataclasses

    cfg = dataclasses.replace(TINY, norm=norm)
    model = make_model(cfg, spread=0.3)
    idx = rand_tokens(2, 8)
    with _CountOps() as counter:
        model(idx)
    per_block = cfg.n_layer
    final = 1 if cfg.final_norm else 0
    assert counter.counts.get("add_layer_norm", 0) == add_ln * per_block
    assert counter.counts.get("layer_norm", 0) == ln * per_block + final
    assert counter.counts.get("bias_gelu", 0) == per_block
    twin = make_model(cfg, kernels="torch", spread=0.3)
    twin.load_state_dict(model.state_dict())
    targets = rand_tokens(2, 8, seed=2)
    out, out_t = model(idx, targets), twin(idx, targets)
    close(out.logits, out_t.logits, dict(atol=2e-5, rtol=2e-5), "logits", rel_to_max=True)
    out.loss.backward()
    out_t.loss.backward()
    for (name, p), p_t in zip(model.named_parameters(), twin.parameters()):
        close(p.grad, p_t.grad, dict(atol=2e-5, rtol=2e-5), name, rel_to_max=True)
