"""pygpt.ops.rotary / torch.ops.pygpt.rotary against the rotation-matrix reference
(tests/reference.py) and the plain-PyTorch kernel set: forward and backward over many shapes
(T = 1, odd T, odd and partial head dims, rotary_dim 0), position ids as one row, offset by a
cache, or per batch row, the strided view of a (B, T, H * D) projection; gradcheck and
gradgradcheck in float64, opcheck, and the fixed tables' refusal of gradients."""
import pytest
import torch

import pygpt.ops
import reference as ref
from helpers import DTYPES, TOL, close, f64, rand
from pygpt.nn.rotary import rotary_tables
from pygpt.ops.rotary import torch_rotary

# (B, H, T, D, rotary_dim)
SHAPES = [(1, 1, 1, 2, 2), (2, 3, 5, 8, 8), (2, 3, 7, 10, 4), (1, 2, 1, 7, 6), (3, 2, 9, 15, 10),
          (2, 4, 33, 64, 64), (1, 1, 17, 33, 0), (2, 2, 4, 6, 2), (1, 3, 65, 96, 32),
          (2, 1, 3, 5, 4)]
MAX_POS = 80


def positions_for(kind, B, T):
    if kind == "arange":
        return torch.arange(T)
    if kind == "offset":  # the new positions after a cache of 11
        return torch.arange(11, 11 + T)
    if kind == "per_row":
        return torch.randint(0, MAX_POS, (B, T))
    assert kind == "expanded", kind  # one row broadcast to (B, T): stride 0 over the batch
    return torch.arange(T).expand(B, T)


def make(shape, dtype, layout="contiguous", requires_grad=True):
    B, H, T, D, rd = shape
    if layout == "heads_view":  # as MultiHeadAttention makes it from a projection
        x = rand(B, T, H * D, dtype=dtype).view(B, T, H, D).transpose(1, 2)
    elif layout == "channels_strided":  # channels not contiguous: copied by the binding
        x = rand(B, H, T, 2 * D, dtype=dtype)[..., ::2]
    else:
        x = rand(B, H, T, D, dtype=dtype)
    cos, sin = rotary_tables(MAX_POS, rd, dtype=dtype)
    return x.requires_grad_(requires_grad), cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["arange", "offset", "per_row", "expanded"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_backward_vs_reference(shape, kind, dtype):
    x, cos, sin = make(shape, dtype)
    positions = positions_for(kind, shape[0], shape[2])
    y = pygpt.ops.rotary(x, cos, sin, positions)
    rx, rcos, rsin = f64(x, cos, sin)
    ry = ref.rotary(rx, rcos, rsin, positions)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    close(y, ry, TOL[dtype], f"{shape} {kind} y")
    g = torch.randn_like(y)
    y.backward(g)
    ry.backward(g.double())
    close(x.grad, rx.grad, TOL[dtype], f"{shape} {kind} dx")


@pytest.mark.parametrize("layout", ["heads_view", "channels_strided"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 8, 8), (2, 2, 7, 10, 6)], ids=str)
def test_strided_inputs(shape, layout):
    x, cos, sin = make(shape, torch.float32, layout)
    positions = positions_for("per_row", shape[0], shape[2])
    y = pygpt.ops.rotary(x, cos, sin, positions)
    close(y, ref.rotary(*f64(x, cos, sin), positions), TOL[torch.float32], layout)
    g = rand(*y.shape).transpose(1, 2).contiguous().transpose(1, 2)  # a strided gradient too
    (dx,) = torch.autograd.grad(y, x, g)
    xc = x.detach().contiguous().requires_grad_()
    (dxc,) = torch.autograd.grad(pygpt.ops.rotary(xc, cos, sin, positions), xc, g)
    torch.testing.assert_close(dx, dxc, atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["offset", "per_row"])
@pytest.mark.parametrize("shape", SHAPES[:6], ids=str)
def test_torch_kernel_set_agrees(shape, kind):
    x, cos, sin = make(shape, torch.float64)
    positions = positions_for(kind, shape[0], shape[2])
    y = pygpt.ops.rotary(x, cos, sin, positions)
    yt = torch_rotary(x, cos, sin, positions)
    close(y, yt, TOL[torch.float64], "torch vs ext")
    g = torch.randn_like(y)
    close(torch.autograd.grad(y, x, g)[0], torch.autograd.grad(yt, x, g)[0], TOL[torch.float64],
          "torch vs ext dx")


def test_inverse_undoes_and_preserves_norm():
    x, cos, sin = make((2, 3, 9, 12, 12), torch.float64, requires_grad=False)
    positions = positions_for("per_row", 2, 9)
    y = pygpt.ops.rotary(x, cos, sin, positions)
    back = torch.ops.pygpt.rotary(y, cos, sin, positions, True)
    close(back, x, TOL[torch.float64], "inverse")
    close(y.norm(dim=-1), x.norm(dim=-1), TOL[torch.float64], "norm")


def test_scores_depend_on_relative_position_only():
    """q_m . k_n after rotation depends on m - n only: the property rotary exists for."""
    q, cos, sin = make((1, 2, 1, 16, 16), torch.float64, requires_grad=False)
    k = rand(1, 2, 1, 16, dtype=torch.float64)

    def score(m, n):
        rq = pygpt.ops.rotary(q, cos, sin, torch.tensor([m]))
        rk = pygpt.ops.rotary(k, cos, sin, torch.tensor([n]))
        return (rq * rk).sum(-1)

    close(score(7, 3), score(40, 36), TOL[torch.float64], "shifted by 33")
    assert not torch.allclose(score(7, 3), score(7, 4))


@pytest.mark.parametrize("shape", [(1, 1, 1, 2, 2), (2, 2, 5, 7, 4), (1, 2, 3, 6, 0)], ids=str)
def test_gradcheck(shape):
    x, cos, sin = make(shape, torch.float64)
    positions = positions_for("per_row", shape[0], shape[2])
    fn = lambda t: pygpt.ops.rotary(t, cos, sin, positions)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("kind", ["arange", "per_row"])
@pytest.mark.parametrize("shape", [(2, 3, 5, 8, 8), (1, 2, 4, 7, 4)], ids=str)
def test_opcheck(shape, kind):
    x, cos, sin = make(shape, torch.float32)
    positions = positions_for(kind, shape[0], shape[2])
    for inverse in (False, True):
        torch.library.opcheck(torch.ops.pygpt.rotary.default, (x, cos, sin, positions, inverse))


def test_empty():
    x, cos, sin = make((0, 2, 3, 4, 4), torch.float32)
    assert pygpt.ops.rotary(x, cos, sin, torch.arange(3)).shape == (0, 2, 3, 4)
    x, cos, sin = make((2, 2, 0, 4, 4), torch.float32)
    assert pygpt.ops.rotary(x, cos, sin, torch.arange(0)).shape == (2, 2, 0, 4)


def test_tables_get_no_gradient():
    x, cos, sin = make((1, 1, 3, 4, 4), torch.float32)
    y = pygpt.ops.rotary(x, cos.requires_grad_(), sin, torch.arange(3))
    with pytest.raises(RuntimeError, match="cos and sin are fixed tables"):
        y.sum().backward()


def test_tables():
    cos, sin = rotary_tables(5, 6, base=100.0)
    assert cos.shape == sin.shape == (5, 3) and cos.dtype == torch.float32
    angles = torch.arange(5.0)[:, None] * 100.0 ** (-torch.arange(0, 6, 2) / 6)
    close(cos, angles.cos(), TOL[torch.float32], "cos")
    close(sin, angles.sin(), TOL[torch.float32], "sin")
