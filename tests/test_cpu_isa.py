"""Every CPU ISA variant of our kernels that this machine can run (pygpt.cpu_isa) against the
plain-PyTorch references, forward and backward, in float32 and float64; and the choice itself:
the default, the PYGPT_CPU_ISA environment variable, and its errors."""
import os
import subprocess
import sys

import pytest
import torch

import reference as ref
from helpers import close, f64, rand
from pygpt import cpu_isa, ops

ISAS = [pytest.param(name, marks=pytest.mark.skipif(
            name not in cpu_isa.supported(), reason=f"this CPU cannot run the {name} kernels"))
        for name in cpu_isa.built()]
TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.float64: dict(atol=1e-10, rtol=1e-10)}
DTYPES = [torch.float32, torch.float64]


@pytest.fixture(params=ISAS)
def isa(request):
    with cpu_isa.use(request.param):
        yield request.param


def test_the_build_holds_the_isas_of_its_platform():
    import platform
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert cpu_isa.built() == (["avx512", "avx2", "base"] if x86 else ["base"])
    supported = cpu_isa.supported()
    assert supported[-1] == "base" and set(supported) <= set(cpu_isa.built())
    if "PYGPT_CPU_ISA" not in os.environ:
        assert cpu_isa.active() == supported[0], "the best ISA this CPU runs is the default"


def test_use_switches_and_restores(isa):
    assert cpu_isa.active() == isa
    with cpu_isa.use("base"):
        assert cpu_isa.active() == "base"
    assert cpu_isa.active() == isa


def test_unknown_or_unrunnable_isa_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown CPU ISA 'sse9'.*this build has: .*base"):
        cpu_isa.set_isa("sse9")
    for name in set(cpu_isa.built()) - set(cpu_isa.supported()):
        with pytest.raises(ValueError, match=f"cannot run the {name} kernels"):
            cpu_isa.set_isa(name)


def _import_with(env_value):
    code = "from pygpt import cpu_isa, ops; print(cpu_isa.active())"
    env = dict(os.environ, PYGPT_CPU_ISA=env_value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def test_environment_variable_forces_an_isa():
    done = _import_with("base")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "base"


def test_bad_environment_variable_fails_the_import_with_the_choices():
    done = _import_with("avx9000")
    assert done.returncode != 0
    assert "PYGPT_CPU_ISA: unknown CPU ISA 'avx9000'; this build has:" in done.stderr


ATTENTION_CASES = [  # B, H, Tq, Tk, D, causal, padded, bias
    (1, 1, 1, 1, 1, True, False, None),
    (2, 3, 37, 37, 19, True, False, None),
    (2, 2, 5, 70, 64, True, False, "relative"),
    (3, 2, 33, 41, 32, False, True, "alibi"),
    (1, 4, 130, 130, 8, True, True, None),
    # around the tiles of every ISA (queries 32 or 48, keys 48, 64 or 96)
    (1, 2, 97, 97, 64, True, False, None),
    (2, 1, 49, 96, 16, True, True, None),
    (1, 1, 65, 33, 40, False, False, "relative"),
    # a few queries (decode steps), which skip the tiles on every ISA
    (3, 2, 1, 70, 32, True, True, "alibi"),
    (2, 2, 4, 9, 16, True, False, "relative"),
    (1, 3, 5, 5, 8, False, True, None),
    (2, 1, 3, 1, 4, True, False, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", ATTENTION_CASES)
def test_attention(isa, dtype, case):
    B, H, Tq, Tk, D, causal, padded, bias = case
    q, k, v = (rand(B, H, T, D, dtype=dtype, requires_grad=True) for T in (Tq, Tk, Tk))
    g = rand(B, H, Tq, D, dtype=dtype)
    ql = torch.randint(0, Tq + 1, (B,)) if padded else torch.full((B,), Tq)
    kl = torch.randint(1, Tk + 1, (B,)) if padded else torch.full((B,), Tk)
    rel = rand(H, 2 * 9 + 1, dtype=dtype, requires_grad=True) if bias == "relative" else None
    slopes = torch.rand(H, dtype=dtype).requires_grad_() if bias == "alibi" else None
    extra = [t for t in (rel, slopes) if t is not None]
    out = ops.attention(q, k, v, causal=causal, q_lengths=ql if padded else None,
                        kv_lengths=kl if padded else None, rel_bias=rel, alibi_slopes=slopes)
    grads = torch.autograd.grad(out, (q, k, v, *extra), g)
    q64, k64, v64, *extra64 = f64(q, k, v, *extra)
    rel64 = extra64.pop(0) if rel is not None else None
    slopes64 = extra64.pop(0) if slopes is not None else None
    expected, _ = ref.padded_attention(q64, k64, v64, ql, kl, causal, rel_bias=rel64,
                                       alibi_slopes=slopes64)
    inputs64 = [t for t in (q64, k64, v64, rel64, slopes64) if t is not None]
    expected_grads = torch.autograd.grad(expected, inputs64, g.double())
    close(out, expected, TOL[dtype], f"{isa} attention out")
    for name, got, want in zip("qkvbs", grads, expected_grads):
        close(got, want, TOL[dtype], f"{isa} attention d{name}", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (5, 13, 129), (2, 768)])
def test_layer_norm(isa, dtype, shape):
    x = rand(*shape, dtype=dtype, requires_grad=True, scale=3.0)
    w, b = (rand(shape[-1], dtype=dtype, requires_grad=True) for _ in range(2))
    g = rand(*shape, dtype=dtype)
    y = ops.layer_norm(x, w, b)
    grads = torch.autograd.grad(y, (x, w, b), g)
    x64, w64, b64 = f64(x, w, b)
    expected = ref.layer_norm(x64, w64, b64)[0]
    expected_grads = torch.autograd.grad(expected, (x64, w64, b64), g.double())
    close(y, expected, TOL[dtype], f"{isa} layer_norm")
    for name, got, want in zip(("x", "weight", "bias"), grads, expected_grads):
        close(got, want, TOL[dtype], f"{isa} layer_norm d{name}", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("N,V,smoothing", [(1, 1, 0.0), (9, 65, 0.0), (17, 1000, 0.1)])
def test_cross_entropy(isa, dtype, N, V, smoothing):
    logits = rand(N, V, dtype=dtype, requires_grad=True, scale=4.0)
    targets = torch.randint(0, V, (N,))
    targets[::3] = -100
    loss = ops.cross_entropy(logits, targets, label_smoothing=smoothing)
    (grad,) = torch.autograd.grad(loss, logits)
    logits64 = f64(logits)
    expected = ref.cross_entropy(logits64, targets, label_smoothing=smoothing)[0]
    (expected_grad,) = torch.autograd.grad(expected, logits64)
    close(loss, expected, TOL[dtype], f"{isa} cross_entropy")
    close(grad, expected_grad, TOL[dtype], f"{isa} cross_entropy grad")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("B,H,T,D,half", [(1, 1, 1, 2, 1), (2, 3, 17, 64, 32), (2, 2, 9, 30, 8)])
def test_rotary(isa, dtype, B, H, T, D, half):
    x = rand(B, H, T, D, dtype=dtype, requires_grad=True)
    angles = torch.rand(T + 3, half, dtype=dtype) * 6
    positions = torch.randint(0, T + 3, (B, T))
    y = ops.rotary(x, angles.cos(), angles.sin(), positions)
    g = rand(B, H, T, D, dtype=dtype)
    (grad,) = torch.autograd.grad(y, x, g)
    x64 = f64(x)
    expected = ref.rotary(x64, angles.double().cos(), angles.double().sin(), positions)
    (expected_grad,) = torch.autograd.grad(expected, x64, g.double())
    close(y, expected, TOL[dtype], f"{isa} rotary")
    close(grad, expected_grad, TOL[dtype], f"{isa} rotary grad")


def test_float64_gradients_pass_gradcheck(isa):
    q, k, v = (rand(2, 2, T, 5, dtype=torch.float64, requires_grad=True) for T in (6, 9, 9))
    assert torch.autograd.gradcheck(lambda *t: ops.attention(*t), (q, k, v))
    x = rand(3, 7, dtype=torch.float64, requires_grad=True)
    w, b = (rand(7, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(ops.layer_norm, (x, w, b))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (5, 13, 129), (2, 512)])
def test_bias_gelu(isa, dtype, shape, approximate):
    x = rand(*shape, dtype=dtype, requires_grad=True, scale=3.0)
    b = rand(shape[-1], dtype=dtype, requires_grad=True)
    g = rand(*shape, dtype=dtype)
    y = ops.bias_gelu(x, b, approximate)
    grads = torch.autograd.grad(y, (x, b), g)
    x64, b64 = f64(x, b)
    expected = torch.nn.functional.gelu(x64 + b64, approximate=approximate)
    expected_grads = torch.autograd.grad(expected, (x64, b64), g.double())
    close(y, expected, TOL[dtype], f"{isa} bias_gelu")
    for name, got, want in zip(("x", "bias"), grads, expected_grads):
        close(got, want, TOL[dtype], f"{isa} bias_gelu d{name}", rel_to_max=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (7, 3), (5, 13, 129), (2, 768)])
def test_add_layer_norm(isa, dtype, shape):
    x, r = (rand(*shape, dtype=dtype, requires_grad=True, scale=2.0) for _ in range(2))
    w, b = (rand(shape[-1], dtype=dtype, requires_grad=True) for _ in range(2))
    g_sum, g_y = rand(*shape, dtype=dtype), rand(*shape, dtype=dtype)
    s, y = ops.add_layer_norm(x, r, w, b)
    grads = torch.autograd.grad((s, y), (x, r, w, b), (g_sum, g_y))
    x64, r64, w64, b64 = f64(x, r, w, b)
    s64 = x64 + r64
    y64 = ref.layer_norm(s64, w64, b64)[0]
    expected_grads = torch.autograd.grad((s64, y64), (x64, r64, w64, b64),
                                         (g_sum.double(), g_y.double()))
    close(s, s64, TOL[dtype], f"{isa} add_layer_norm sum")
    close(y, y64, TOL[dtype], f"{isa} add_layer_norm")
    for name, got, want in zip(("x", "residual", "weight", "bias"), grads, expected_grads):
        close(got, want, TOL[dtype], f"{isa} add_layer_norm d{name}", rel_to_max=True)
