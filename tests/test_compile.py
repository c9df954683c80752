"""torch.compile over the GPT on our kernels: the custom ops trace into one graph (dynamo's
explain counts 0 graph breaks; fullgraph=True, which raises on any break, compiles), the compiled
forward and backward match eager mode, and `train(..., compile=True)` trains like eager. What
compiling relies on is also checked directly and cheaply: each op's fake implementation gives
the real outputs' metadata, strides included, for strided inputs like the model's.

Inductor generates C++ for the CPU and builds it with the system compiler, so these tests skip
when inductor or a C++ compiler is missing. Its on-disk caches are switched off here: they are
keyed without our ops' fake implementations, so a cached graph could hide a change to them. The
model is tiny, and each cold compilation takes some seconds on one core."""

import copy
import dataclasses
import os
import shutil

import pytest
import torch

from pygpt.config import ModelConfig, TrainConfig
from pygpt.data.text import SHIPPED_TEXT
from pygpt.models import GPT
from pygpt.ops.registry import OPS
from pygpt.training import train


def _inductor_available() -> tuple[bool, str]:
    try:
        import torch._dynamo  # noqa: F401
        import torch._inductor.config as inductor_config
    except Exception as e:  # a torch build without dynamo/inductor
        return False, f"torch.compile unavailable: {e}"
    cxx = inductor_config.cpp.cxx
    cxx = os.environ.get("CXX") or (cxx[-1] if isinstance(cxx, (tuple, list)) else cxx) or "g++"
    if not any(shutil.which(c) for c in (cxx, "g++", "c++", "clang++")):
        return False, "no C++ compiler for inductor's CPU code"
    return True, ""


_OK, _WHY = _inductor_available()
needs_inductor = pytest.mark.skipif(not _OK, reason=_WHY)
pytestmark = [  # With the caches off (below), dynamo says so once per compilation.
    pytest.mark.filterwarnings("ignore:dynamo_pgo force disabled:UserWarning"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")]

CFG = ModelConfig(vocab_size=40, block_size=8, n_layer=1, n_head=2, n_embd=16)

@pytest.fixture(autouse=True)
def fresh_compiler():
    # The config's own patch(), not monkeypatch: newer pytest restores a module attribute it
    # could not see statically by deleting it, which removes the setting from torch's config.
    with torch.compiler.config.patch(force_disable_caches=True):
        torch._dynamo.reset()
        yield
        torch._dynamo.reset()


def batch(seed: int, B: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, CFG.vocab_size, (B, CFG.block_size), generator=gen)
    y = torch.randint(0, CFG.vocab_size, (B, CFG.block_size), generator=gen)
    return x, y


@needs_inductor
def test_fullgraph_check_has_teeth():
    """fullgraph=True really raises on a graph break (so compiling with it proves there is
    none); the break is found while tracing, before any code is generated."""
    def with_break(t):
        t = t + 1
        torch._dynamo.graph_break()
        return t * 2

    with pytest.raises(Exception, match="graph_break"):
        torch.compile(with_break, fullgraph=True)(torch.ones(3))


@needs_inductor
def test_explain_reports_no_graph_breaks():
    model = GPT(CFG, kernels="ext").train()
    x, y = batch(0)
    explained = torch._dynamo.explain(model)(x, y)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    assert not explained.break_reasons
    # Our ops are in the graph as ops (not traced through into Python or ATen pieces).
    ops = {str(op) for op in explained.ops_per_graph[0]}
    for name in ("pygpt.attention", "pygpt.layer_norm", "pygpt.cross_entropy"):
        assert any(name in op for op in ops), (name, ops)


def test_rotary_model_has_no_graph_breaks():
    """Rotary positions (the tables' bounds check on Python ints) trace into the one graph."""
    model = GPT(dataclasses.replace(CFG, pos_encoding="rotary"), kernels="ext").train()
    explained = torch._dynamo.explain(model)(*batch(0))
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    assert any("pygpt.rotary" in str(op) for op in explained.ops_per_graph[0])


@needs_inductor
def test_compiled_fullgraph_forward_backward_matches_eager():
    torch.manual_seed(0)
    eager = GPT(CFG, kernels="ext").train()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    for seed in (1, 2):  # the second call reuses the compiled graph
        x, y = batch(seed)
        eager.zero_grad(set_to_none=True)
        compiled_model.zero_grad(set_to_none=True)
        expected = eager(x, y)
        expected.loss.backward()
        got = compiled(x, y)
        got.loss.backward()
        torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
        grads = dict(compiled_model.named_parameters())
        for name, p in eager.named_parameters():
            assert grads[name].grad is not None, name
            scale = max(1.0, p.grad.abs().max().item())
            torch.testing.assert_close(grads[name].grad, p.grad, atol=1e-5 * scale, rtol=1e-4,
                                       msg=lambda m, name=name: f"{name}: {m}")


@needs_inductor
def test_train_with_compile(tmp_path):
    """Two steps through torch.compile train like two eager steps, and save a checkpoint that
    loads (the compiled wrapper's names never reach the weights file)."""
    text = tmp_path / "text.txt"
    text.write_text(SHIPPED_TEXT.read_text(encoding="utf-8")[:2000], encoding="utf-8")
    model_cfg = dataclasses.replace(CFG, block_size=8)
    common = dict(data=str(text), max_iters=2, eval_interval=2, eval_iters=1, batch_size=2,
                  warmup_iters=1, lr=1e-3)
    eager = train(model_cfg, TrainConfig(out=str(tmp_path / "eager"), **common), progress=False)
    compiled = train(model_cfg, TrainConfig(out=str(tmp_path / "compiled"), compile=True,
                                            **common), progress=False)
    assert compiled["step"] == 2
    for key in ("train_loss", "val_loss"):
        assert compiled[key] == pytest.approx(eager[key], abs=1e-4)
    import pygpt

    model_c, _ = pygpt.load(tmp_path / "compiled")
    model_e, _ = pygpt.load(tmp_path / "eager")
    for (name, a), (_, b) in zip(model_c.state_dict().items(), model_e.state_dict().items()):
        assert not name.startswith("_orig_mod")
        torch.testing.assert_close(a, b, atol=1e-4, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


# --- fake implementations vs the kernels, on strided inputs -----------------------------------

def _strided_qkv(B=2, T=8, H=2, D=8):
    """q, k, v as the model makes them: (B, H, T, D) views of one (B, T, 3 * H * D) projection,
    dense but not contiguous."""
    qkv = torch.randn(B, T, 3 * H * D)
    q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(H * D, dim=-1))
    assert not q.is_contiguous()
    return q, k, v


def _case_args(case):
    if case.startswith("attention"):
        q, k, v = _strided_qkv()
        if case == "attention":
            return torch.ops.pygpt.attention.default, (q, k, v, True, None)
        out, lse = torch.ops.pygpt.attention(q, k, v, True, None)
        return torch.ops.pygpt.attention_backward.default, (torch.randn_like(out), q, k, v, out,
                                                            lse, True, None)
    if case.startswith("layer_norm"):
        x = torch.randn(4, 8, 16).transpose(0, 1)  # dense, not contiguous
        w, b = torch.randn(16), torch.randn(16)
        if case == "layer_norm":
            return torch.ops.pygpt.layer_norm.default, (x, w, b, 1e-5)
        _, mean, rstd = torch.ops.pygpt.layer_norm(x, w, b, 1e-5)
        return torch.ops.pygpt.layer_norm_backward.default, (torch.randn_like(x), x, w, mean,
                                                             rstd, True, True)
    if case == "rotary":
        q, _, _ = _strided_qkv()
        return torch.ops.pygpt.rotary.default, (q, torch.randn(12, 3), torch.randn(12, 3),
                                                torch.randint(0, 12, (8,)), False)
    if case.startswith("bias_gelu"):
        x, b = torch.randn(4, 8, 16).transpose(0, 1), torch.randn(16)  # x dense, not contiguous
        if case == "bias_gelu":
            return torch.ops.pygpt.bias_gelu.default, (x, b)
        return torch.ops.pygpt.bias_gelu_backward.default, (torch.randn_like(x), x, b, True)
    if case.startswith("add_layer_norm"):
        x, r = (torch.randn(4, 8, 16).transpose(0, 1) for _ in range(2))  # dense, not contiguous
        w, b = torch.randn(16), torch.randn(16)
        if case == "add_layer_norm":
            return torch.ops.pygpt.add_layer_norm.default, (x, r, w, b, 1e-5)
        s, y, mean, rstd = torch.ops.pygpt.add_layer_norm(x, r, w, b, 1e-5)
        return torch.ops.pygpt.add_layer_norm_backward.default, (
            torch.randn_like(y), torch.randn_like(s), s, w, mean, rstd, True, True)
    logits = torch.randn(12, 20)[:, :13]  # a column slice: strided rows
    targets = torch.randint(0, 13, (12,))
    if case == "cross_entropy":
        return torch.ops.pygpt.cross_entropy.default, (logits, targets, -100)
    if case == "cross_entropy_backward":
        loss, lse = torch.ops.pygpt.cross_entropy(logits, targets, -100)
        return torch.ops.pygpt.cross_entropy_backward.default, (torch.ones(()), logits, targets,
                                                                lse, -100)
    if case == "linear_cross_entropy":
        x, w, b = torch.randn(12, 20)[:, :8], torch.randn(13, 8), torch.randn(13)
        return torch.ops.pygpt.linear_cross_entropy.default, (x, w, targets, b, -100, 0.0, 5,
                                                              True, True, True)
    raise AssertionError(f"no strided case for torch.ops.pygpt.{case}: add one to _case_args")


@pytest.mark.parametrize("case", [raw for op in OPS for raw in op.raw_ops])
def test_fakes_match_kernel_strides(case):
    """What torch.compile relies on: each op's fake (meta) implementation describes the real
    outputs exactly, strides included, for the strided inputs a model passes (opcheck's
    fake-tensor check compares the two). Cheap: nothing is compiled."""
    op, args = _case_args(case)
    torch.library.opcheck(op, args, test_utils=("test_faketensor",))
