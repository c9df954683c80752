"""The CUDA kernels against the CPU ops as the oracle: every op forward and backward over the CPU
tests' shape families, in float32 (tight), bfloat16 and float16 (loose: inputs are rounded to the
16-bit type for both sides, the CUDA side accumulates in float32 but stores 16-bit results, so
errors of a few ulps are expected, ~1e-2 relative for bfloat16, a few 1e-3 for float16); opcheck
on CUDA; and a short training run on the GPU whose loss curve follows the CPU run's. Skipped
where no GPU is present."""
import pytest
import torch

import pygpt.ops as ops
from pygpt.config import ModelConfig, TrainConfig
from pygpt.models import GPT
from pygpt.nn.rotary import rotary_tables
from pygpt.training import make_optimizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=3e-2, rtol=3e-2),
       torch.float16: dict(atol=1e-2, rtol=1e-2)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _pair(*shapes, dtype, scale=1.0):
    """The same random inputs on the CPU (float32, from the dtype-rounded values) and on CUDA."""
    cuda = [(torch.randn(*s) * scale).to(dtype).cuda().requires_grad_() for s in shapes]
    cpu = [t.detach().float().cpu().requires_grad_() for t in cuda]
    return cpu, cuda


def _close(actual, expected, dtype, what):
    torch.testing.assert_close(actual.float().cpu(), expected.float(), equal_nan=True,
                               msg=lambda m: f"{what} ({dtype}): {m}", **TOL[dtype])


# (B, H, Tq, Tk, Dk, Dv)
ATTN_SHAPES = [(1, 1, 1, 1, 1, 1), (2, 3, 7, 7, 16, 16), (2, 2, 5, 13, 8, 8), (2, 2, 13, 5, 8, 8),
               (1, 2, 33, 33, 7, 5), (3, 1, 65, 40, 12, 20), (1, 2, 70, 129, 128, 128),
               (1, 1, 1, 2048, 64, 64), (2, 4, 1024, 1024, 64, 64), (1, 2, 100, 100, 96, 32)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=str)
def test_attention_matches_cpu(shape, causal, dtype):
    B, H, Tq, Tk, Dk, Dv = shape
    (q, k, v), (qc, kc, vc) = _pair((B, H, Tq, Dk), (B, H, Tk, Dk), (B, H, Tk, Dv), dtype=dtype)
    out, lse = torch.ops.pygpt.attention(q, k, v, causal, None)
    out_c, lse_c = torch.ops.pygpt.attention(qc, kc, vc, causal, None)
    assert out_c.dtype == dtype and lse_c.dtype == torch.float32
    _close(out_c, out, dtype, "out")
    _close(lse_c, lse, torch.float32 if dtype == torch.float32 else dtype, "lse")
    grad = torch.randn_like(out)
    out.backward(grad)
    out_c.backward(grad.to(dtype).cuda())
    for name, a, b in (("dq", qc, q), ("dk", kc, k), ("dv", vc, v)):
        _close(a.grad, b.grad, dtype, name)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (768, 128), (64, 4096), (5, 3, 127)], ids=str)
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_cpu(shape, affine, dtype):
    C = shape[-1]
    (x, w, b), (xc, wc, bc) = _pair(shape, (C,), (C,), dtype=dtype)
    if not affine:
        w = b = wc = bc = None
    y = ops.layer_norm(x, w, b)
    yc = ops.layer_norm(xc, wc, bc)
    _close(yc, y, dtype, "y")
    grad = torch.randn_like(y)
    y.backward(grad)
    yc.backward(grad.to(dtype).cuda())
    _close(xc.grad, x.grad, dtype, "dx")
    if affine:
        scale = max(1.0, x.shape[0] ** 0.5)  # weight/bias gradients are sums over rows
        torch.testing.assert_close(wc.grad.float().cpu(), w.grad, atol=TOL[dtype]["atol"] * scale,
                                   rtol=TOL[dtype]["rtol"])
        torch.testing.assert_close(bc.grad.float().cpu(), b.grad, atol=TOL[dtype]["atol"] * scale,
                                   rtol=TOL[dtype]["rtol"])


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N, V", [(1, 1), (7, 3), (3072, 65), (64, 50257), (8, 131072)], ids=str)
@pytest.mark.parametrize("ignored", ["none", "some", "all"])
def test_cross_entropy_matches_cpu(N, V, ignored, dtype, smoothing):
    (logits,), (logits_c,) = _pair((N, V), dtype=dtype, scale=3.0)
    targets = torch.randint(V, (N,))
    if ignored == "some":
        targets[::3] = -100
    elif ignored == "all":
        targets[:] = -100
    loss = ops.cross_entropy(logits, targets, label_smoothing=smoothing)
    loss_c = ops.cross_entropy(logits_c, targets.cuda(), label_smoothing=smoothing)
    assert loss_c.dtype == dtype
    _close(loss_c, loss, dtype, "loss")
    loss.backward()
    loss_c.backward()
    _close(logits_c.grad, logits.grad, dtype, "grad_logits")


# (B, H, T, D, rotary_dim)
ROTARY_SHAPES = [(1, 1, 1, 2, 2), (2, 3, 7, 10, 4), (3, 2, 9, 15, 10), (2, 4, 257, 128, 64),
                 (1, 2, 33, 64, 0)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("shape", ROTARY_SHAPES, ids=str)
def test_rotary_matches_cpu(shape, per_row, dtype):
    B, H, T, D, rd = shape
    tables = [t.to(dtype) for t in rotary_tables(300, rd)]
    (x,), (xc,) = _pair((B, T, H * D), dtype=dtype)  # the heads view of a projection
    view = lambda t: t.view(B, T, H, D).transpose(1, 2)  # noqa: E731
    positions = torch.randint(0, 300, (B, T) if per_row else (T,))
    y = ops.rotary(view(x), *(t.float() for t in tables), positions)
    y_c = ops.rotary(view(xc), *(t.cuda() for t in tables), positions.cuda())
    assert y_c.dtype == dtype and y_c.is_contiguous()
    _close(y_c, y, dtype, "y")
    grad = torch.randn_like(y)
    y.backward(grad)
    y_c.backward(grad.to(dtype).cuda())
    _close(xc.grad, x.grad, dtype, "dx")


def test_bad_input_on_cuda():
    q = torch.randn(1, 1, 4, 8, device="cuda")
    with pytest.raises(RuntimeError, match="q must be float32, bfloat16 or float16 on CUDA"):
        torch.ops.pygpt.attention(q.double(), q.double(), q.double())  # the raw op: no upcast
    with pytest.raises(RuntimeError, match="head dims up to 128"):
        big = torch.randn(1, 1, 4, 130, device="cuda")
        ops.attention(big, big, big)
    with pytest.raises(RuntimeError, match=r"\bk\b.*cpu|device"):
        ops.attention(q, q.cpu(), q)
    with pytest.raises(ValueError, match="out of range"):
        ops.cross_entropy(torch.randn(3, 5, device="cuda"), torch.tensor([0, 5, 1], device="cuda"))
    with pytest.raises(ValueError, match="label_smoothing"):
        ops.cross_entropy(torch.randn(3, 5, device="cuda"), torch.tensor([0, 4, 1], device="cuda"),
                          label_smoothing=-0.1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [False, True])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 7, 7, 16, 16), (2, 2, 5, 70, 8, 8),
                                   (2, 2, 70, 129, 64, 64)], ids=str)
def test_position_bias_matches_cpu(shape, causal, lengths, dtype):
    """A relative table and ALiBi slopes (and their gradients, atomically summed on CUDA)."""
    B, H, Tq, Tk, Dk, Dv = shape
    (q, k, v, table), (qc, kc, vc, tc) = _pair((B, H, Tq, Dk), (B, H, Tk, Dk), (B, H, Tk, Dv),
                                               (H, 9), dtype=dtype)
    slopes = (torch.rand(H) + 0.05).to(dtype).float().requires_grad_()
    sc = slopes.detach().to(dtype).cuda().requires_grad_()
    ql, kl = (torch.tensor([Tq, Tq // 2]), torch.tensor([Tk, Tk // 3])) if lengths else (None,) * 2
    out = ops.attention(q, k, v, causal=causal, q_lengths=ql, kv_lengths=kl, rel_bias=table,
                        alibi_slopes=slopes)
    out_c = ops.attention(qc, kc, vc, causal=causal, q_lengths=ql.cuda() if lengths else None,
                          kv_lengths=kl.cuda() if lengths else None, rel_bias=tc,
                          alibi_slopes=sc)
    _close(out_c, out, dtype, "out")
    grad = torch.randn_like(out)
    out.backward(grad)
    out_c.backward(grad.to(dtype).cuda())
    for name, a, b in (("dq", qc, q), ("dk", kc, k), ("dv", vc, v), ("dtable", tc, table),
                       ("dslopes", sc, slopes)):
        scale = max(1.0, b.grad.abs().max().item())  # sums over many (query, key) pairs
        tol = {key: value * scale for key, value in TOL[dtype].items()}
        torch.testing.assert_close(a.grad.float().cpu(), b.grad, msg=lambda m: f"{name}: {m}",
                                   **tol)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_propagates_on_cuda(value):
    """As on the CPU: a NaN / inf in a query row makes that row NaN, never zeros."""
    (q, k, v), (qc, kc, vc) = _pair((1, 2, 40, 16), (1, 2, 40, 16), (1, 2, 40, 16),
                                    dtype=torch.float32)
    with torch.no_grad():
        qc[0, 1, 17, 0] = value
    out = ops.attention(qc, kc, vc, causal=True)
    assert torch.isnan(out[0, 1, 17]).all()
    assert torch.isfinite(out[0, 0]).all() and torch.isfinite(out[0, 1, :17]).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_opcheck_on_cuda(dtype):
    def t(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=True)

    torch.library.opcheck(torch.ops.pygpt.attention.default, (t(2, 2, 5, 16), t(2, 2, 9, 16),
                                                              t(2, 2, 9, 8), True, None))
    torch.library.opcheck(torch.ops.pygpt.attention.default,
                          (t(2, 2, 5, 16), t(2, 2, 9, 16), t(2, 2, 9, 8), True, None, None, None,
                           t(2, 7), t(2).abs().detach()))
    torch.library.opcheck(torch.ops.pygpt.layer_norm.default, (t(4, 33), t(33), t(33), 1e-5))
    torch.library.opcheck(torch.ops.pygpt.cross_entropy.default,
                          (t(6, 11), torch.randint(11, (6,), device="cuda"), -100))
    torch.library.opcheck(torch.ops.pygpt.cross_entropy.default,
                          (t(6, 11), torch.randint(11, (6,), device="cuda"), -100, 0.1))
    cos, sin = (c.to(dtype).cuda() for c in rotary_tables(20, 6))
    torch.library.opcheck(torch.ops.pygpt.rotary.default,
                          (t(2, 3, 5, 8), cos, sin, torch.randint(20, (2, 5), device="cuda")))


def test_training_on_gpu_follows_cpu():
    cfg = ModelConfig(vocab_size=65, block_size=32, n_layer=2, n_head=2, n_embd=64)
    train_cfg = TrainConfig(lr=1e-3, warmup_iters=5)
    data = torch.randint(65, (8, 33), generator=torch.Generator().manual_seed(0))
    losses = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(0)
        model = GPT(cfg).to(device)
        optimizer = make_optimizer(model, train_cfg)
        curve = []
        for _ in range(20):
            loss = model(data[:, :-1].to(device), data[:, 1:].to(device)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            curve.append(loss.item())
        losses[device] = curve
    assert losses["cuda"] == pytest.approx(losses["cpu"], abs=2e-3)
    assert losses["cuda"][-1] < losses["cuda"][0] - 0.5
