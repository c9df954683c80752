"""The building blocks of pygpt.nn on their own, each against a plain-PyTorch reference written
here: what the GPT tests cannot reach because the GPT never builds it (post-norm and norm-free
blocks, non-causal and cross-attention, heads narrower or wider than the input, chunked causal
appends to a cache) or only checks end to end (the MLP's formula, the cache containers, position offsets, the
sinusoidal table, switching kernels on a single layer, GPT-2 initialisation). Small shapes, so
the module runs in a second or two."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import close, f64, rand, spread_
from reference import causal_mask
from pygpt.kernels import KERNELS
from pygpt.nn import (MLP, Block, Embeddings, KVCache, LayerKV, LayerNorm, LearnedPositions,
                      MultiHeadAttention, SinusoidalPositions, gpt2_init, position_encoding)
from pygpt.nn.position import sinusoidal_table

TOL = dict(atol=1e-5, rtol=1e-5)
KERNEL_NAMES = list(KERNELS)


def ref_attention(m, x, context=None, causal=False):
    """MultiHeadAttention written out: softmax(Q K^T / sqrt(d)) V per head, heads concatenated,
    then W_O if the module has one. Differentiable in x, context and m's parameters."""
    source = x if context is None else context
    B, T, _ = x.shape
    S = source.shape[1]
    H, D = m.n_head, m.head_dim
    (wq, bq), (wk, bk), (wv, bv) = separate_projections(m)
    q = F.linear(x, wq, bq).view(B, T, H, D).transpose(1, 2)
    k = F.linear(source, wk, bk).view(B, S, H, D).transpose(1, 2)
    v = F.linear(source, wv, bv).view(B, S, H, D).transpose(1, 2)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    if causal:
        scores = scores.masked_fill(~causal_mask(T, S), float("-inf"))
    y = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, H * D)
    return F.linear(y, m.proj.weight, m.proj.bias) if m.proj is not None else y


def separate_projections(m):
    """(weight, bias) of W_Q, W_K and W_V, each its own tensor (slices of the fused ones)."""
    fused = [m.q, m.kv] if m.cross else [m.qkv]  # nn.Linear, FusedLinear or FusedLinear

    def split(t, f):
        return t.split(getattr(f, "widths", (f.out_features,)))

    weights = [w for f in fused for w in split(f.weight, f)]
    biases = ([b for f in fused for b in split(f.bias, f)] if fused[0].bias is not None
              else [None] * 3)
    return list(zip(weights, biases))


def ref_layer_norm(norm, x):
    return F.layer_norm(x, x.shape[-1:], norm.weight, norm.bias, norm.eps)


def grads(out, inputs, seed=3):
    """Gradients of a fixed random projection of out with respect to inputs."""
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed)).to(out.dtype)
    return torch.autograd.grad((out * w).sum(), inputs)


def check_against_float64(module, run, reference, tensors, msg):
    """run(module, *tensors) against reference(copy, *copies) on a float64 copy of module and
    inputs: the output, and the gradients of every input and parameter. Gradients are compared
    to within 1e-5 of the largest one (some, like the key bias's, are exactly zero in exact
    arithmetic and only rounding noise in float32)."""
    module64 = copy.deepcopy(module).double()
    tensors64 = [f64(t) if t is not None else None for t in tensors]
    out, expected = run(module, *tensors), reference(module64, *tensors64)
    close(out, expected, TOL, msg, rel_to_max=True)
    got = grads(out, [t for t in tensors if t is not None] + list(module.parameters()))
    want = grads(expected, [t for t in tensors64 if t is not None] + list(module64.parameters()))
    scale = max(1.0, max(g.abs().max().item() for g in want))
    names = [f"input {i}" for i, t in enumerate(tensors) if t is not None]
    names += [name for name, _ in module.named_parameters()]
    for name, g, g_ref in zip(names, got, want):
        close(g, g_ref, dict(atol=1e-5 * scale, rtol=1e-4), f"{msg}: grad of {name}")
    return out


# --- MultiHeadAttention -----------------------------------------------------------------------

# (dim, n_head, head_dim, context (length, width) or None, causal, out_proj)
ATTENTION_CASES = {
    "self-noncausal": (16, 2, 8, None, False, True),
    "self-causal-wide-heads": (16, 2, 12, None, True, True),  # heads 24 wide, W_O back to 16
    "self-noncausal-no-proj": (16, 4, 4, None, False, False),
    "cross-longer-wider": (16, 2, 8, (7, 24), False, True),
    "cross-shorter-narrower": (16, 4, 6, (3, 10), False, True),
    "cross-causal": (16, 2, 8, (9, 12), True, True),  # bottom-right: the queries are the last 5
}


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_matches_reference(case, kernels):
    dim, n_head, head_dim, ctx, causal, out_proj = ATTENTION_CASES[case]
    torch.manual_seed(0)
    m = MultiHeadAttention(dim, n_head, head_dim, causal=causal, out_proj=out_proj,
                           context_dim=ctx[1] if ctx else None)
    spread_(m)
    m.kernels = kernels
    x = rand(2, 5, dim, scale=2.0, requires_grad=True)
    context = rand(2, ctx[0], ctx[1], scale=2.0, requires_grad=True) if ctx else None
    out = check_against_float64(m, lambda mod, x, c: mod(x, c),
                                lambda mod, x, c: ref_attention(mod, x, c, causal),
                                [x, context], case)
    assert out.shape == (2, 5, dim)


def test_attention_reference_sees_the_difference():
    """The comparison above can fail: a module that is causal differs from the non-causal
    reference, and cross-attention differs from attending over x."""
    torch.manual_seed(0)
    m = spread_(MultiHeadAttention(16, 2, 8, causal=True))
    x = rand(2, 5, 16, scale=2.0)
    assert not torch.allclose(m(x), ref_attention(m, x, causal=False), atol=1e-3)
    c = spread_(MultiHeadAttention(16, 2, 8, causal=False))
    context = rand(2, 5, 16, scale=2.0)
    assert not torch.allclose(c(x, context), ref_attention(c, x), atol=1e-3)


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
@pytest.mark.parametrize("chunks", [(3, 4), (1, 6), (4, 1, 2)], ids=str)
def test_cache_appends_in_chunks_equal_one_call(chunks, kernels):
    """Causal self-attention over a cache: running the sequence in chunks (the later ones with
    several queries against more keys) gives the outputs of one call, and the cache ends up
    with every position's keys and values."""
    torch.manual_seed(0)
    m = spread_(MultiHeadAttention(16, 2, 8, causal=True))
    m.kernels = kernels
    x = rand(2, sum(chunks), 16, scale=2.0)
    full = m(x)
    cache, outs, start = LayerKV(), [], 0
    for n in chunks:
        outs.append(m(x[:, start:start + n], cache=cache))
        start += n
        assert cache.length == start
    close(torch.cat(outs, dim=1), full, TOL, f"chunks {chunks}", rel_to_max=True)
    keys, values = m.qkv.parts(x, 1)
    close(cache.k, keys.view(2, -1, 2, 8).transpose(1, 2), TOL, "cached keys")
    close(cache.v, values.view(2, -1, 2, 8).transpose(1, 2), TOL, "cached values")


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
def test_cross_attention_cache_holds_the_context_once(kernels):
    """Cross-attention with a cache (a decoder stepping over an encoder's output): the first call
    fills the cache from the context, later calls reuse it (whatever context they pass) and
    equal attending over the context afresh; the cache never grows."""
    torch.manual_seed(0)
    m = spread_(MultiHeadAttention(16, 2, 8, causal=False, context_dim=12))
    m.kernels = kernels
    x, context = rand(2, 6, 16, scale=2.0), rand(2, 7, 12, scale=2.0)
    cache = LayerKV()
    first = m(x[:, :4], context, cache=cache)
    assert cache.length == 7
    later = [m(x[:, t:t + 1], context, cache=cache) for t in (4, 5)]
    assert cache.length == 7
    stale = m(x[:, 5:6], torch.zeros_like(context), cache=cache)  # the cached context wins
    close(torch.cat([first, *later], dim=1), m(x, context), TOL, "cached cross-attention",
          rel_to_max=True)
    close(stale, later[-1], TOL, "a later context is ignored", rel_to_max=True)


def test_attention_without_out_proj_needs_matching_width():
    with pytest.raises(ValueError, match=r"heads \(2 x 6\) must be as wide as the input \(16\)"):
        MultiHeadAttention(16, 2, 6, out_proj=False)
    m = MultiHeadAttention(16, 2, 8, out_proj=False)
    assert m.proj is None
    assert m(rand(1, 3, 16)).shape == (1, 3, 16)
    assert MultiHeadAttention(16, 2, 6).proj.weight.shape == (16, 12)  # W_O maps 12 back to 16


# --- MLP and Block ----------------------------------------------------------------------------

def test_mlp_matches_reference():
    """Widen, exact (erf) GELU, project back; without bias no biases at all."""
    torch.manual_seed(0)
    mlp = spread_(MLP(8, 24))
    x = rand(3, 4, 8, scale=2.0)
    h = F.linear(x, mlp.fc.weight, mlp.fc.bias)
    expected = F.linear(h * 0.5 * (1 + torch.erf(h / math.sqrt(2))), mlp.proj.weight, mlp.proj.bias)
    close(mlp(x), expected, TOL, "mlp", rel_to_max=True)
    plain = MLP(8, 24, bias=False)
    assert plain.fc.bias is None and plain.proj.bias is None
    assert plain.fc.weight.shape == (24, 8) and plain.proj.weight.shape == (8, 24)


def _block(norm, residual=True, mlp=True):
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 2, 8, causal=True)
    block = Block(16, attn, MLP(16, 32) if mlp else None, norm=norm, residual=residual)
    return spread_(block)


def _reference_block(block, x):
    """The block's composition written out, with its own attention and MLP as the sub-layers."""
    attn = lambda h: ref_attention(block.attn, h, causal=True)  # noqa: E731
    if block.norm == "pre":
        x = x + attn(ref_layer_norm(block.attn_norm, x))
        return x + block.mlp(ref_layer_norm(block.mlp_norm, x))
    if block.norm == "post":  # the original Transformer's "Add & Norm"
        x = ref_layer_norm(block.attn_norm, x + attn(x))
        return ref_layer_norm(block.mlp_norm, x + block.mlp(x))
    if block.residual:
        x = x + attn(x)
        return x + block.mlp(x) if block.mlp is not None else x
    return block.mlp(attn(x)) if block.mlp is not None else attn(x)


@pytest.mark.parametrize("kernels", KERNEL_NAMES)
@pytest.mark.parametrize("norm, residual, mlp", [
    ("pre", True, True), ("post", True, True), ("none", True, True), ("none", False, True),
    ("none", False, False),
], ids=["pre", "post", "none-residual", "none-no-residual", "none-no-residual-no-mlp"])
def test_block_matches_reference(norm, residual, mlp, kernels):
    block = _block(norm, residual, mlp)
    block.kernels = kernels
    x = rand(2, 6, 16, requires_grad=True)
    check_against_float64(block, lambda mod, x: mod(x), _reference_block, [x],
                          f"norm={norm} residual={residual} mlp={mlp}")


def test_block_structure_and_placements_differ():
    """Norms exist only where placed (none without an MLP to precede), a bad placement is
    refused, and pre- and post-norm of the same weights really compute different things."""
    assert _block("none").attn_norm is None and _block("none").mlp_norm is None
    assert _block("pre", mlp=False).mlp_norm is None and _block("pre", mlp=False).mlp is None
    with pytest.raises(ValueError, match="norm must be 'pre', 'post' or 'none'"):
        Block(16, MultiHeadAttention(16, 2, 8), norm="sandwich")
    x = rand(2, 6, 16)
    pre, post = _block("pre"), _block("post")
    post.load_state_dict(pre.state_dict())
    assert not torch.allclose(pre(x), post(x), atol=1e-3)


# --- KVCache and LayerKV ----------------------------------------------------------------------

def test_layer_kv_length_and_append():
    layer = LayerKV()
    assert layer.length == 0 and layer.k is None and layer.v is None
    k1, v1 = rand(2, 3, 4, 5), rand(2, 3, 4, 5)
    k, v = layer.append(k1, v1)
    assert layer.length == 4 and torch.equal(k, k1) and torch.equal(v, v1)
    k2, v2 = rand(2, 3, 1, 5), rand(2, 3, 1, 5)
    k, v = layer.append(k2, v2)
    assert layer.length == 5
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], 2))
    assert layer.k is k and layer.v is v


def test_kv_cache_layers_round_trip_and_errors():
    cache = KVCache(3)
    assert len(cache) == 3 and cache.length == 0 and KVCache(0).length == 0
    assert all(isinstance(cache[i], LayerKV) for i in range(3))
    cache[0].append(rand(1, 2, 4, 3), rand(1, 2, 4, 3))
    assert cache[1].length == 0  # each layer its own container
    assert cache.length == 4
    pairs = [(rand(1, 2, 7, 3), rand(1, 2, 7, 3)) for _ in range(2)]
    restored = KVCache.from_tensors(pairs)
    assert len(restored) == 2 and restored.length == 7
    assert all(a is c and b is d for (a, b), (c, d) in zip(restored.tensors(), pairs))
    again = KVCache.from_tensors(restored.tensors())
    assert all(a is c and b is d for (a, b), (c, d) in zip(again.tensors(), pairs))
    t = rand(1, 2, 7, 3)
    for bad in (dict(k=t), dict(v=t)):
        with pytest.raises(ValueError, match="both keys and values, or neither"):
            LayerKV(**bad)
    with pytest.raises(ValueError, match="both keys and values, or neither"):
        KVCache.from_tensors([(t, t), (t, None)])


# --- Embeddings and positions -----------------------------------------------------------------

@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_embeddings_start_offsets_positions(position):
    torch.manual_seed(0)
    emb = spread_(Embeddings(11, 8, 10, position=position, norm=True))
    idx = torch.randint(11, (2, 10))
    table = emb.pos.weight if position == "learned" else sinusoidal_table(10, 8)
    expected = ref_layer_norm(emb.norm, emb.tok.weight[idx] + table)
    close(emb(idx), expected, TOL, "all positions")
    for start in (1, 4, 9):
        close(emb(idx[:, start:], start=start), expected[:, start:], TOL, f"start {start}")
    # Without the offset a later chunk would get the first positions' vectors.
    assert not torch.allclose(emb(idx[:, 4:]), expected[:, 4:], atol=1e-3)


def test_embeddings_context_length_and_kinds():
    emb = Embeddings(11, 8, 10)
    assert isinstance(emb.pos, LearnedPositions) and isinstance(emb.pos, torch.nn.Embedding)
    assert emb.norm is None
    emb(torch.zeros(1, 4, dtype=torch.long), start=6)  # exactly fills the context: fine
    with pytest.raises(ValueError, match="11 positions exceed the context length 10"):
        emb(torch.zeros(1, 4, dtype=torch.long), start=7)
    with pytest.raises(ValueError, match="11 positions exceed the context length 10"):
        emb(torch.zeros(1, 11, dtype=torch.long))
    with pytest.raises(ValueError, match="unknown position encoding 'rotary'"):
        position_encoding("rotary", 10, 8)


@pytest.mark.parametrize("dim", [6, 5])
def test_sinusoidal_table_values(dim):
    """table[p, 2i] = sin(p / 10000^(2i/dim)), table[p, 2i+1] = cos of the same; an odd width
    ends on a sine."""
    table = sinusoidal_table(50, dim)
    assert table.shape == (50, dim) and table.dtype == torch.float32
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * (dim // 2) + [0.0] * (dim % 2)))
    for p in (1, 7, 49):
        for c in range(dim):
            angle = p / 10000 ** ((c - c % 2) / dim)
            want = math.sin(angle) if c % 2 == 0 else math.cos(angle)
            assert table[p, c].item() == pytest.approx(want, abs=1e-6), (p, c)
    assert table[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-7)
    assert table[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-7)
    enc = SinusoidalPositions(50, dim)
    assert enc.state_dict() == {} and list(enc.parameters()) == []  # fixed, never saved
    assert torch.equal(enc(torch.tensor([3, 0, 49])), table[[3, 0, 49]])


# --- switching kernels on single layers -------------------------------------------------------

def test_switching_kernels_on_single_layers():
    norm = spread_(LayerNorm(8))
    x = rand(3, 8, scale=2.0)
    assert norm.kernels == "ext" and norm.kern is KERNELS["ext"]
    a = norm(x)
    norm.kernels = "torch"
    assert norm.kernels == "torch" and norm.kern is KERNELS["torch"]
    close(a, norm(x), TOL, "layer norm after switching")
    close(a, ref_layer_norm(norm, x), TOL, "layer norm vs F.layer_norm")
    with pytest.raises(ValueError, match="unknown kernels 'cuda-magic'"):
        norm.kernels = "cuda-magic"
    assert norm.kernels == "torch" and norm.kern is KERNELS["torch"]  # unchanged

    attn = MultiHeadAttention(16, 2, 8)
    attn.kernels = "torch"
    assert attn.kern is KERNELS["torch"]
    with pytest.raises(ValueError, match="unknown kernels"):
        attn.kernels = "nope"

    # Switching a block reaches the layers inside it, and switching one layer only that layer.
    block = _block("pre")
    block.kernels = "torch"
    assert [m.kern for m in (block.attn_norm, block.attn, block.mlp_norm)] == [KERNELS["torch"]] * 3
    block.attn.kernels = "ext"
    assert block.attn.kern is KERNELS["ext"] and block.attn_norm.kern is KERNELS["torch"]


# --- GPT-2 initialisation ---------------------------------------------------------------------

def test_gpt2_init_stds():
    """Linear weights N(0, 0.02) with zero biases, residual projections N(0, 0.02/sqrt(2 n_layer)),
    learned positions N(0, 0.02), token embeddings N(0, embed_std) even when a head shares them,
    layer norms untouched."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    model.tok = torch.nn.Embedding(300, 256)
    model.pos = LearnedPositions(300, 256)
    model.fc = torch.nn.Linear(256, 256)
    model.proj = torch.nn.Linear(256, 256)
    model.norm = LayerNorm(256)
    model.head = torch.nn.Linear(256, 300, bias=False)
    model.head.weight = model.tok.weight  # tied
    with torch.no_grad():
        model.norm.weight.fill_(2.0)
        model.fc.bias.fill_(1.0)
    gpt2_init(model, n_layer=8, residual_projections=[model.proj], token_embedding=model.tok,
              embed_std=0.5)
    assert model.fc.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert torch.all(model.fc.bias == 0) and torch.all(model.proj.bias == 0)
    assert model.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert model.pos.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.tok.weight.std().item() == pytest.approx(0.5, rel=0.05)
    assert model.head.weight is model.tok.weight
    assert torch.all(model.norm.weight == 2.0) and torch.all(model.norm.bias == 0)
    for p in (model.fc.weight, model.proj.weight, model.pos.weight, model.tok.weight):
        assert abs(p.mean().item()) < 0.05 * p.std().item()
