"""pygpt.ops.linear_cross_entropy (the LM head and the loss fused, chunked over rows) against the
unfused F.linear + F.cross_entropy in float64: value and gradients of x, weight and bias over
one chunk, several, a ragged last one and one row per chunk, ignored targets (some, all) and
label smoothing; float64 gradcheck; opcheck; clear errors for bad input; the GPT's fused loss
against its unfused one; and CUDA against the CPU where a GPU is present."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import pygpt.models.gpt as gpt_module
from helpers import (ARCHS, TINY, WHAT_DTYPE, WHAT_RANGE, WHAT_RANK, WHAT_SIZE, close,
                     make_model, raises_naming, rand_tokens, twin)
from pygpt.kernels import KERNELS
from pygpt.ops import linear_cross_entropy
from pygpt.ops.linear_cross_entropy import CHUNK_BYTES, chunk_rows

F32 = dict(atol=1e-5, rtol=1e-5)
F32_GRAD = dict(atol=2e-6, rtol=2e-5)

# (N, C, V, chunk_rows); None: the default chunking
CASES = [
    (1, 4, 3, None),  # one row
    (5, 3, 1, None),  # one class: the loss is 0
    (7, 5, 13, None),  # odd sizes, one chunk
    (7, 5, 13, 1),  # a row per chunk
    (33, 16, 101, 4),  # 9 chunks, the last one row
    (50, 8, 257, 7),  # ragged last chunk
    (64, 24, 2049, 16),  # chunks fit exactly
    (300, 8, 50257, None),  # GPT-2's vocabulary: the default makes two chunks
]


def make_inputs(N, C, V, bias, ignore, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, C, generator=g, dtype=torch.float64) * 2
    w = torch.randn(V, C, generator=g, dtype=torch.float64) / C ** 0.5
    b = torch.randn(V, generator=g, dtype=torch.float64) if bias else None
    t = torch.randint(0, V, (N,), generator=g)
    if ignore == "some":
        t[::3] = -100
    elif ignore == "all":
        t[:] = -100
    leaves = [a.to(device, dtype).requires_grad_() if a is not None else None for a in (x, w, b)]
    return (*leaves, t.to(device))


def grads_of(loss, *inputs):
    wanted = [a for a in inputs if a is not None]
    got = iter(torch.autograd.grad(loss, wanted))
    return [next(got) if a is not None else None for a in inputs]


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("ignore", ["none", "some", "all"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_unfused_float32(case, bias, ignore, smoothing):
    N, C, V, rows = case
    x, w, b, t = make_inputs(N, C, V, bias, ignore)
    loss = linear_cross_entropy(x, w, t, b, label_smoothing=smoothing, chunk_rows=rows)
    assert loss.dtype == torch.float32 and loss.shape == ()
    rx, rw, rb = (a.detach().double().requires_grad_() if a is not None else None
                  for a in (x, w, b))
    ref = F.cross_entropy(F.linear(rx, rw, rb), t, label_smoothing=smoothing)
    close(loss, ref, F32, "loss")
    got, want = grads_of(loss * 1.5, x, w, b), grads_of(ref * 1.5, rx, rw, rb)
    for name, g, r in zip(("x", "weight", "bias"), got, want):
        if r is not None:
            if ignore == "all":  # loss NaN, as F.cross_entropy's; every gradient zero
                assert torch.isnan(loss) and torch.equal(g, torch.zeros_like(g)), name
            close(g, r, F32_GRAD, f"grad {name}", rel_to_max=True)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("rows", [1, 3, 100])
def test_gradcheck_float64(rows, smoothing):
    x, w, b, t = make_inputs(7, 5, 11, True, "some", dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, w, b: linear_cross_entropy(x, w, t, b, label_smoothing=smoothing,
                                             chunk_rows=rows), (x, w, b))


def test_ignore_index_other_than_default():
    x, w, b, t = make_inputs(9, 4, 6, True, "none", dtype=torch.float64)
    t[1::2] = 3  # a real class, ignored here
    got = linear_cross_entropy(x, w, t, b, ignore_index=3, chunk_rows=2)
    close(got, F.cross_entropy(F.linear(x, w, b), t, ignore_index=3), dict(atol=1e-12, rtol=0))


def test_only_the_gradients_required_are_computed():
    """A frozen weight gets none (and costs no grad_weight); under no_grad nothing is kept."""
    x, w, b, t = make_inputs(10, 4, 9, True, "some", dtype=torch.float64)
    w.requires_grad_(False)
    loss = linear_cross_entropy(x, w, t, b, chunk_rows=3)
    gx, gb = torch.autograd.grad(loss, (x, b))
    ref = F.cross_entropy(F.linear(x, w, b), t)
    rgx, rgb = torch.autograd.grad(ref, (x, b))
    close(gx, rgx, dict(atol=1e-12, rtol=1e-10), "grad x")
    close(gb, rgb, dict(atol=1e-12, rtol=1e-10), "grad bias")
    with torch.no_grad():
        assert not linear_cross_entropy(x, w, t, b).requires_grad
    raw = torch.ops.pygpt.linear_cross_entropy(x.detach(), w, t, None, -100, 0.0, 4, False,
                                               False, False)
    assert [tuple(g.shape) for g in raw[1:]] == [(0,), (0,), (0,)]


def test_retained_graph_backward_twice():
    """A loss's backward hands its saved gradients to .grad without a copy; with the graph
    retained, a second backward still adds the same gradients, whatever .grad went through."""
    x, w, b, t = make_inputs(9, 4, 7, True, "some")
    loss = linear_cross_entropy(x, w, t, b, chunk_rows=4)
    loss.backward(retain_graph=True)
    w.grad.mul_(0)  # an in-place change of .grad must not reach the saved gradient
    loss.backward(retain_graph=True)
    loss.backward()
    ref = F.cross_entropy(F.linear(x, w, b), t)
    for name, a, g in zip(("x", "weight", "bias"), (x, w, b), grads_of(ref, x, w, b)):
        close(a.grad, g * (2 if name == "weight" else 3), F32_GRAD, f"grad {name}",
              rel_to_max=True)


def test_double_backward_is_refused():
    x, w, _, t = make_inputs(4, 3, 5, False, "none", dtype=torch.float64)
    (gx,) = torch.autograd.grad(linear_cross_entropy(x, w, t), x, create_graph=False)
    assert gx.shape == x.shape
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(linear_cross_entropy(x, w, t), x, create_graph=True)


@pytest.mark.parametrize("bias", [False, True])
def test_opcheck(bias):
    x, w, b, t = make_inputs(9, 4, 11, bias, "some")
    torch.library.opcheck(torch.ops.pygpt.linear_cross_entropy.default,
                          (x, w, t, b, -100, 0.1, 4, True, True, bias))


def test_traces_into_one_graph():
    """torch.compile (fullgraph, AOT autograd) runs the op from its fake and autograd formula."""
    x, w, b, t = make_inputs(10, 4, 9, True, "some")
    fn = torch.compile(lambda x, w, b: linear_cross_entropy(x, w, t, b, chunk_rows=3),
                       backend="aot_eager", fullgraph=True)
    got = fn(x, w, b)
    want = linear_cross_entropy(x, w, t, b, chunk_rows=3)
    close(got, want, dict(atol=0, rtol=0), "compiled loss")
    for name, g, r in zip(("x", "weight", "bias"), grads_of(got, x, w, b),
                          grads_of(want, x, w, b)):
        close(g, r, dict(atol=0, rtol=0), f"compiled grad {name}")


def test_chunk_rows_bounds_the_chunk():
    for n, v in [(4096, 50257), (4096, 8192), (10, 50257), (1, 10**9), (0, 5), (1000, 3)]:
        rows = chunk_rows(n, v, torch.float32)
        chunks = -(-n // rows)
        assert rows >= 1 and (rows * v * 4 <= CHUNK_BYTES or rows == 1), (n, v, rows)
        assert n == 0 or chunks * rows - n < chunks, (n, v, rows)  # no sliver: evened out
    assert chunk_rows(4096, 50257, torch.float32) == 164  # 25 chunks of <= 32 MiB
    assert chunk_rows(100, 10, torch.float64, max_bytes=80 * 7) == 7


def test_torch_kernel_set_is_the_unfused_reference():
    x, w, b, t = make_inputs(12, 6, 17, True, "some", dtype=torch.float64)
    ext = KERNELS["ext"].linear_cross_entropy(x, w, t, b, label_smoothing=0.1)
    ref = KERNELS["torch"].linear_cross_entropy(x, w, t, b, label_smoothing=0.1)
    close(ext, ref, dict(atol=1e-12, rtol=1e-12), "ext vs torch")


def bad_inputs():
    x, w, b, t = (a.detach() for a in make_inputs(6, 4, 5, True, "none"))
    yield "x", WHAT_RANK, (x[0], w, t[:1], b), {}
    yield "weight", WHAT_SIZE, (x, w[:, :3], t, b), {}
    yield "targets", WHAT_SIZE, (x, w, t[:5], b), {}
    yield "targets", WHAT_DTYPE, (x, w, t.int(), b), {}
    yield "targets", WHAT_RANGE, (x, w, torch.tensor([0, 1, 5, 2, 0, 1]), b), {}
    yield "targets", WHAT_RANGE, (x, w, torch.tensor([0, -1, 2, 2, 0, 1]), b), {}
    yield "bias", WHAT_SIZE, (x, w, t, b[:4]), {}
    yield "weight", WHAT_DTYPE, (x, w.double(), t, b), {}
    yield "x", WHAT_DTYPE, (x.long(), w, t, b), {}
    yield "weight", r"device", (x, w.to("meta"), t, b), {}
    yield "label_smoothing", WHAT_RANGE, (x, w, t, b), {"label_smoothing": 1.5}
    yield "chunk_rows", WHAT_RANGE, (x, w, t, b), {"chunk_rows": 0}


BAD = list(bad_inputs())


@pytest.mark.parametrize("arg, what, args, kwargs", BAD,
                         ids=[f"{i}-{case[0]}" for i, case in enumerate(BAD)])
@pytest.mark.parametrize("caller", ["public", "raw"])
def test_bad_input_names_the_argument(arg, what, args, kwargs, caller):
    with raises_naming(arg, what):
        if caller == "public":
            linear_cross_entropy(*args, **kwargs)
        else:
            torch.ops.pygpt.linear_cross_entropy(
                *args, -100, kwargs.get("label_smoothing", 0.0), kwargs.get("chunk_rows", 4),
                True, True, True)


def test_bad_input_fails_when_traced_too():
    x, w, _, t = (a.detach() if a is not None else None
                  for a in make_inputs(6, 4, 5, False, "none"))
    w = w[:, :3].contiguous()
    with torch._subclasses.FakeTensorMode() as mode, raises_naming("weight", WHAT_SIZE):
        fx, fw, ft = (mode.from_tensor(a) for a in (x, w, t))
        linear_cross_entropy(fx, fw, ft)


# --- the GPT's fused loss -------------------------------------------------------------------

@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("arch", ["learned", "untied-nobias"])
def test_gpt_fused_loss_matches_unfused(arch, kernels, monkeypatch):
    """With the threshold forced down to the test vocabulary, the GPT's loss comes from
    linear_cross_entropy (no logits returned) and equals, with every gradient, the unfused one."""
    cfg = ARCHS[arch]
    unfused = make_model(cfg, kernels, spread=0.3)
    fused = twin(unfused, kernels)
    x, y = rand_tokens(3, cfg.block_size), rand_tokens(3, cfg.block_size, seed=2)
    y[0, :5] = -100
    want = unfused(x, y)
    assert want.logits is not None
    monkeypatch.setattr(gpt_module, "FUSED_LOSS_MIN_VOCAB", cfg.vocab_size)
    got = fused(x, y)
    assert got.logits is None
    assert fused(x).logits is not None  # without targets: the logits, as before
    close(got.loss, want.loss, F32, "loss")
    got.loss.backward()
    want.loss.backward()
    ref = dict(unfused.named_parameters())
    for name, p in fused.named_parameters():
        close(p.grad, ref[name].grad, F32_GRAD, f"grad {name}", rel_to_max=True)


def test_gpt_uses_the_fused_loss_from_the_threshold():
    assert gpt_module.FUSED_LOSS_MIN_VOCAB > TINY.vocab_size  # the other tests keep logits
    cfg = dataclasses.replace(TINY, vocab_size=gpt_module.FUSED_LOSS_MIN_VOCAB, n_layer=1)
    model = make_model(cfg)
    out = model(rand_tokens(2, 8, vocab=cfg.vocab_size), rand_tokens(2, 8, vocab=cfg.vocab_size))
    assert out.logits is None and out.loss.requires_grad


# --- CUDA against the CPU ---------------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [(7, 5, 13, None), (50, 8, 257, 7), (300, 64, 50257, None)],
                         ids=str)
def test_cuda_matches_cpu(case, dtype):
    N, C, V, rows = case
    tol = F32_GRAD if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    cuda = make_inputs(N, C, V, True, "some", dtype=dtype, device="cuda")
    cpu = [a.detach().float().cpu().requires_grad_() for a in cuda[:3]] + [cuda[3].cpu()]
    losses = [linear_cross_entropy(*ins[:2], ins[3], ins[2], label_smoothing=0.1,
                                   chunk_rows=rows) for ins in (cuda, cpu)]
    assert losses[0].dtype == dtype and losses[0].device.type == "cuda"
    close(losses[0].float().cpu(), losses[1], tol, "loss")
    for got, want, name in zip(grads_of(losses[0], *cuda[:3]), grads_of(losses[1], *cpu[:3]),
                               ("x", "weight", "bias")):
        close(got.float().cpu(), want, tol, f"grad {name}", rel_to_max=True)
