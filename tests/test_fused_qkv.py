"""Attention's fused input projections (pygpt.nn.fused_linear, pygpt.nn.attention): one matmul
for self-attention's Q, K and V (cross-attention: K and V) gives what three separate nn.Linears
with the same weights give, its outputs are views of one result, it draws the same initial
weights as the separate layers did, and weights saved with separate `q`, `k`, `v` (the layout
before the fusion) load into it (rewritten by pygpt.storage.compat) and give the same outputs."""

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import nn

import pygpt
from helpers import close, rand, spread_, state_dicts_equal
from test_nn import separate_projections
from pygpt.storage.compat import stack_separate_projections
from pygpt.config import ModelConfig
from pygpt.kernels import KERNELS
from pygpt.families import build
from pygpt.nn import MultiHeadAttention
from pygpt.nn.fused_linear import FusedLinear, weight_blocks
from pygpt.storage.run_files import WEIGHTS

TOL = dict(atol=1e-6, rtol=1e-5)  # float32, the same weights: only the matmuls' rounding differs

# (dim, n_head, head_dim, v_head_dim, context width or None, bias)
CASES = {
    "self": (16, 2, 8, None, None, True),
    "self-no-bias-narrow-values": (16, 4, 6, 2, None, False),
    "cross-wider-context": (16, 2, 8, 12, 24, True),
    "cross-same-width": (16, 2, 4, None, 16, False),
}


def in_projections(m):
    """m's input projections: [qkv] (self-attention layout) or [q, kv] (cross-attention)."""
    return [m.q, m.kv] if m.cross else [m.qkv]


def by_map(linear, t):
    """t (a weight, bias or gradient of linear) split into its maps' rows."""
    return t.split(getattr(linear, "widths", (linear.out_features,)))


def separate_linears(m):
    """Three nn.Linears W_Q, W_K, W_V with copies of m's (fused) weights."""
    linears = []
    for w, b in separate_projections(m):
        linear = nn.Linear(w.shape[1], w.shape[0], bias=b is not None)
        with torch.no_grad():
            linear.weight.copy_(w)
            if b is not None:
                linear.bias.copy_(b)
        linears.append(linear)
    return linears


def separate_forward(m, linears, x, context):
    """m's forward with the three separate projections (the layout before the fusion)."""
    source = x if context is None else context
    B, T, _ = x.shape
    q, k, v = (m._heads(lin(t)) for lin, t in zip(linears, (x, source, source)))
    y = m.kern.attention(q, k, v, causal=m.causal).transpose(1, 2).reshape(B, T, -1)
    return m.proj(y)


@pytest.mark.parametrize("kernels", list(KERNELS))
@pytest.mark.parametrize("case", list(CASES))
def test_fused_equals_separate_projections(case, kernels):
    """Outputs and every gradient: each map's rows of the fused weight's (and bias's) gradient
    are its separate layer's gradient, and the inputs' gradients are the same sums."""
    dim, n_head, head_dim, v_head_dim, ctx, bias = CASES[case]
    torch.manual_seed(0)
    m = spread_(MultiHeadAttention(dim, n_head, head_dim, v_head_dim=v_head_dim, bias=bias,
                                   context_dim=ctx, causal=ctx is None))
    m.kernels = kernels
    linears = separate_linears(m)
    x = rand(2, 5, dim, scale=2.0)
    context = rand(2, 7, ctx, scale=2.0) if ctx else None
    w = torch.randn(2, 5, dim, generator=torch.Generator().manual_seed(1))

    def run(forward):
        inputs = [t.clone().requires_grad_() for t in (x, context) if t is not None]
        out = forward(*inputs) if ctx else forward(inputs[0], None)
        (out * w).sum().backward()
        return out, [t.grad for t in inputs]

    fused_out, fused_input_grads = run(m)
    split_out, split_input_grads = run(lambda x, c: separate_forward(m, linears, x, c))
    close(fused_out, split_out, TOL, case)
    for got, want in zip(fused_input_grads, split_input_grads):
        close(got, want, TOL, f"{case}: input gradient", rel_to_max=True)
    for param in ("weight", "bias")[:1 + bias]:
        got = [g for f in in_projections(m) for g in by_map(f, getattr(f, param).grad)]
        want = [getattr(lin, param).grad for lin in linears]
        # Relative to the largest: the key bias's gradient is exactly 0, but for rounding.
        tol = dict(TOL, atol=TOL["atol"] * max(1.0, max(g.abs().max().item() for g in want)))
        for name, g, g_ref in zip("QKV", got, want):
            close(g, g_ref, tol, f"{case}: gradient of W_{name}'s {param}")


def test_self_attention_layout_also_attends_over_a_context():
    """Either layout computes either kind: self-attention's fused weight used for a context
    (Q from x, K and V from the context through a slice of the weight), cross-attention's for x
    alone, both equal to the separate projections."""
    torch.manual_seed(0)
    x, context = rand(2, 5, 16, scale=2.0), rand(2, 3, 16, scale=2.0)
    for m in (MultiHeadAttention(16, 2, 8, causal=False), MultiHeadAttention(16, 2, 8, cross=True)):
        spread_(m)
        linears = separate_linears(m)
        for ctx in (context, None):
            close(m(x, ctx), separate_forward(m, linears, x, ctx), TOL, f"cross={m.cross}")


def test_parts_are_views_of_one_matmul():
    torch.manual_seed(0)
    f = spread_(FusedLinear(8, (4, 4, 6)))
    x = rand(3, 8)
    q, k, v = f.parts(x)
    assert (q.shape, k.shape, v.shape) == ((3, 4), (3, 4), (3, 6))
    assert q.data_ptr() + 4 * 4 == k.data_ptr() and k.data_ptr() + 4 * 4 == v.data_ptr()
    k2, v2 = f.parts(x, 1)  # keys and values only: one matmul with the weight's last rows
    assert k2.data_ptr() + 4 * 4 == v2.data_ptr()
    close(k2, F.linear(x, f.weight[4:8], f.bias[4:8]), TOL, "keys alone")
    close(v2, F.linear(x, f.weight[8:], f.bias[8:]), TOL, "values alone")
    with pytest.raises(ValueError, match="widths must be positive"):
        FusedLinear(8, (4, 0))


@pytest.mark.parametrize("init", [lambda w: nn.init.xavier_uniform_(w),
                                  lambda w: nn.init.normal_(w, 0.0, 0.02)],
                         ids=["xavier", "normal"])
def test_init_draws_as_the_separate_layers(init):
    """Built and initialised map by map (weight_blocks), the fused layer holds exactly the
    weights three nn.Linears built and initialised in turn from the same seed hold: each map's
    Xavier bound comes from its own shape, not the stacked one."""
    torch.manual_seed(0)
    f = FusedLinear(8, (4, 4, 6))
    for w in weight_blocks(f):
        init(w)
    torch.manual_seed(0)
    linears = [nn.Linear(8, n) for n in (4, 4, 6)]
    for lin in linears:
        init(lin.weight)
    assert torch.equal(f.weight, torch.cat([lin.weight for lin in linears]))


def separate_layout(model, state=None):
    """model's state dict (or `state`, tensors of model by name) as the code before the fusion
    saved it: each fused projection split into separate `q`, `k`, `v` weights and biases
    (cross-attention's `q` was always apart)."""
    state = dict(model.state_dict() if state is None else state)
    for name, module in model.named_modules():
        if isinstance(module, FusedLinear):
            attention, fused = name.rsplit(".", 1)
            for param in ("weight", "bias"):
                if f"{name}.{param}" in state:
                    pieces = state.pop(f"{name}.{param}").split(module.widths)
                    for part, piece in zip(fused, pieces):  # "qkv" or "kv"
                        state[f"{attention}.{part}.{param}"] = piece.clone()
    return state


GPT_CFG = ModelConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
SEQ2SEQ_CFG = ModelConfig(arch="seq2seq", vocab_size=11, block_size=8, n_layer=1, n_dec_layer=1,
                          n_head=2, n_embd=16, qk_dim=4, v_dim=12)


def test_old_layout_gpt_loads_and_gives_the_same_logits():
    torch.manual_seed(0)
    model = build(GPT_CFG).eval()
    old = separate_layout(model)
    for part in ("q", "k", "v"):  # the names the code before the fusion used
        assert old[f"blocks.0.attn.{part}.weight"].shape == (16, 16)
        assert old[f"blocks.1.attn.{part}.bias"].shape == (16,)
    assert not any(".qkv." in name for name in old)
    torch.manual_seed(1)
    loaded = build(GPT_CFG).eval()
    loaded.load_state_dict(stack_separate_projections(loaded, old))  # strict: all of it
    ids = torch.randint(0, 11, (2, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_old_layout_seq2seq_loads_with_cross_attention():
    """Self-attention's q, k, v go into qkv; cross-attention's k, v into kv, its q stays."""
    torch.manual_seed(0)
    model = build(SEQ2SEQ_CFG).eval()
    old = separate_layout(model)
    assert old["decoder.0.cross.q.weight"].shape == (8, 16)
    assert old["decoder.0.cross.k.weight"].shape == (8, 16)
    assert old["decoder.0.cross.v.weight"].shape == (24, 16)
    torch.manual_seed(1)
    loaded = build(SEQ2SEQ_CFG).eval()
    loaded.load_state_dict(stack_separate_projections(loaded, old))
    assert all(torch.equal(t, model.state_dict()[name])
               for name, t in loaded.state_dict().items())
    src = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        memory = loaded.encode(src)
        assert torch.equal(memory, model.encode(src))
        assert torch.equal(loaded.decode(src[:, :3], memory), model.decode(src[:, :3], memory))


def test_old_layout_checkpoint_loads(ckpt):
    """A checkpoint folder whose weights file holds the separate projections (as every
    checkpoint saved before the fusion does) loads to the same model."""
    from safetensors.torch import save_file

    model, _ = pygpt.load(ckpt)
    with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}  # a tied head once
        meta = f.metadata()
    old = separate_layout(model, tensors)
    assert "blocks.0.attn.q.weight" in old and "blocks.0.attn.qkv.weight" not in old
    save_file(old, str(ckpt / WEIGHTS), metadata=meta)
    loaded, _ = pygpt.load(ckpt)
    state_dicts_equal(loaded.state_dict(), model.state_dict())


def test_old_tensors_that_do_not_stack_are_reported():
    """Separate tensors of other widths are not stacked into garbage: load_state_dict names
    them unexpected and the fused weight missing (checkpoint loading turns that into a one-line
    error)."""
    torch.manual_seed(0)
    model = build(GPT_CFG)
    old = separate_layout(model)
    old["blocks.0.attn.k.weight"] = torch.zeros(16, 15)
    fresh = build(GPT_CFG)
    missing, unexpected = fresh.load_state_dict(stack_separate_projections(fresh, old),
                                                strict=False)
    assert missing == ["blocks.0.attn.qkv.weight"]
    assert sorted(unexpected) == [f"blocks.0.attn.{p}.weight" for p in "kqv"]


def separate_optimizer_state(model, optimizer, saved):
    """An optimizer state_dict of `optimizer` (over model) as the code before the fusion saved
    it: each fused parameter's entry split into its maps' entries, in map order."""
    widths = {id(p): m.widths for m in model.modules() if isinstance(m, FusedLinear)
              for p in (m.weight, m.bias) if p is not None}
    state, groups, old, new = {}, [], 0, 0
    for group, saved_group in zip(optimizer.param_groups, saved["param_groups"]):
        start = old
        for p in group["params"]:
            parts = widths.get(id(p), (None,))
            for k, width in enumerate(parts):
                if new in saved["state"]:
                    state[old + k] = {
                        key: (v.split(parts)[k].clone() if width is not None and v.dim() > 0
                              else v.clone()) for key, v in saved["state"][new].items()}
            old, new = old + len(parts), new + 1
        groups.append({**saved_group, "params": list(range(start, old))})
    return {"state": state, "param_groups": groups}


def test_a_run_saved_before_the_fusion_resumes_exactly(trained, tmp_path, text_file):
    """Weights and AdamW moments saved with separate q, k, v resume into the fused model and
    train on exactly as the same run saved in the fused layout does."""
    import dataclasses
    import shutil

    from safetensors.torch import save_file

    from helpers import TINY_MODEL, tiny_train_cfg
    from pygpt.storage.run_files import TRAIN_STATE
    from pygpt.storage.compat import stack_fused_states
    from pygpt.training import make_optimizer, train

    fused, old = tmp_path / "fused", tmp_path / "old"
    for run in (fused, old):
        shutil.copytree(trained[0], run)
    model, _ = pygpt.load(old)
    with safe_open(str(old / WEIGHTS), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = f.metadata()
    save_file(separate_layout(model, tensors), str(old / WEIGHTS), metadata=meta)
    cfg = tiny_train_cfg(text_file, old, max_iters=8)
    optimizer = make_optimizer(model, cfg)
    state = torch.load(old / TRAIN_STATE, weights_only=True)
    separate = separate_optimizer_state(model, optimizer, state["optimizer"])
    assert len(separate["param_groups"][0]["params"]) > len(optimizer.param_groups[0]["params"])
    restacked = stack_fused_states(model, optimizer, separate)
    assert restacked["param_groups"] == state["optimizer"]["param_groups"]
    for index, entry in state["optimizer"]["state"].items():
        assert all(torch.equal(v, restacked["state"][index][k]) for k, v in entry.items())
    assert stack_fused_states(model, optimizer, state["optimizer"]) is state["optimizer"]
    torch.save({**state, "optimizer": separate}, old / TRAIN_STATE)

    train(TINY_MODEL, cfg, resume=True, progress=False)
    train(TINY_MODEL, dataclasses.replace(cfg, out=str(fused)), resume=True, progress=False)
    state_dicts_equal(pygpt.load(old)[0].state_dict(), pygpt.load(fused)[0].state_dict())
