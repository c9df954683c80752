"""GPTs with rotary positions, score biases or none (pygpt.positions.RELATIVE_ENCODINGS), and the ReLU MLP: our
kernels against plain PyTorch, prefill + decode through the cache against one full forward, the
rolling KV cache past the context length (against re-running the last block_size tokens for a
one-layer model, and against full-sequence sliding-window attention for a deeper one), the
config's checks and old configs' defaults. (BERT with rotary and padded rows: test_bert.)"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import TINY, close, make_model, rand_tokens, twin
from pygpt.config import ModelConfig
from pygpt.config.fields import config_from_dict, to_dict
from pygpt.decoding.sampling import Sampling
from pygpt.kernels import KERNELS, KernelModule
from pygpt.nn import MLP, Rotary
from pygpt.ops.attention import explicit_position_bias

# Half of each head rotating, ReLU and post-norm (the documents' block); whole heads; no positions.
ROTARY = dataclasses.replace(TINY, pos_encoding="rotary", rotary_dim=8, activation="relu",
                             norm="post")
ROTARY_FULL = dataclasses.replace(TINY, pos_encoding="rotary", rope_base=500.0)
NONE = dataclasses.replace(TINY, pos_encoding="none")
# The score biases slide the same way (their bias depends on key - query distance only).
RELATIVE = dataclasses.replace(TINY, pos_encoding="relative", max_distance=5)
ALIBI = dataclasses.replace(TINY, pos_encoding="alibi", n_head=3, n_embd=24)
CONFIGS = {"rotary": ROTARY, "rotary-full": ROTARY_FULL, "none": NONE, "relative": RELATIVE,
           "alibi": ALIBI}
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ext_matches_torch_forward_backward(name):
    ext = make_model(CONFIGS[name], "ext", spread=0.3)
    ref = twin(ext, "torch")
    x, y = rand_tokens(3, 16), rand_tokens(3, 16, seed=2)
    out_e, out_t = ext(x, y), ref(x, y)
    close(out_e.logits, out_t.logits, dict(atol=1e-5, rtol=1e-5), "logits", rel_to_max=True)
    out_e.loss.backward()
    out_t.loss.backward()
    grads_t = dict(ref.named_parameters())
    for pname, p in ext.named_parameters():
        close(p.grad, grads_t[pname].grad, dict(atol=1e-5, rtol=1e-4), f"grad {pname}",
              rel_to_max=True)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_no_absolute_position_embedding(name):
    model = make_model(CONFIGS[name])
    assert model.embed.pos is None and model.rolling_cache
    learned = [key for key in model.state_dict() if "pos" in key or "rotary" in key]
    assert learned == (["pos_bias.table"] if name == "relative" else [])  # the bias table only
    rotaries = [m for m in model.modules() if isinstance(m, Rotary)]
    assert len(rotaries) == (TINY.n_layer if name.startswith("rotary") else 0)


def test_rotary_sees_order_and_only_relative_positions():
    """With rotary a token's logits depend on the order of the tokens before it (unlike with no
    positions, where one causal layer sees the last token's predecessors as a set), and not on
    where the sequence starts."""
    rotary = make_model(ROTARY, spread=0.3).eval()
    none = make_model(dataclasses.replace(NONE, n_layer=1), spread=0.3).eval()
    x = rand_tokens(1, 6)
    swapped = x[:, [1, 0, 2, 3, 4, 5]]
    assert not torch.allclose(rotary(x).logits[:, -1], rotary(swapped).logits[:, -1], atol=1e-3)
    close(none(x).logits[:, -1], none(swapped).logits[:, -1], TOL, "none: order-blind")
    # The same 6 tokens at positions 40 .. 45 of a rolling cache (an empty cache that has
    # "dropped" 40 positions) give the logits they give at 0 .. 5.
    cache = rotary.new_cache()
    for layer in cache.layers:
        layer.dropped = 40
    close(rotary(x, cache=cache).logits, rotary(x).logits, TOL, "shifted by 40")


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_prefill_decode_matches_full_forward(name, kernels):
    model = make_model(CONFIGS[name], kernels, spread=0.3).eval()
    idx = rand_tokens(2, 16)
    full = model(idx).logits
    for prefill in (1, 7, 15):
        logits, cache = model.prefill(idx[:, :prefill])
        steps = [logits]
        for t in range(prefill, 16):
            steps.append(model.step(idx[:, t:t + 1], cache))
        assert cache.length == cache.position == 16
        close(torch.cat(steps, dim=1), full, TOL, f"prefill {prefill}", rel_to_max=True)


def _rolling_logits(model, tokens, first):
    """Logits of the last position for every prefix length > first: a prefill of the first
    `first` tokens, then one-token steps through the model's (rolling) cache."""
    logits, cache = model.prefill(tokens[:, :first])
    out = [logits[:, -1]]
    for t in range(first, tokens.shape[1] - 1):
        out.append(model.step(tokens[:, t:t + 1], cache)[:, -1])
        assert cache.length == min(t + 1, model.context_length) and cache.position == t + 1
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_rolling_cache_equals_last_window_one_layer(name, kernels):
    """One layer: each cached step past the context equals re-running the last block_size tokens
    (the same keys, at other absolute positions); and generation agrees cached and uncached."""
    cfg = dataclasses.replace(CONFIGS[name], n_layer=1)
    model = make_model(cfg, kernels, spread=0.3).eval()
    bs = cfg.block_size
    tokens = rand_tokens(2, 3 * bs + 5)
    with torch.no_grad():
        rolled = _rolling_logits(model, tokens, 5)
        for i, t in enumerate(range(5, tokens.shape[1])):
            window = tokens[:, max(0, t - bs):t]
            close(rolled[:, i], model(window).logits[:, -1], TOL, f"length {t}", rel_to_max=True)
    for prompt in (rand_tokens(1, 3), rand_tokens(2, bs + 4)):
        greedy = dict(sampling=Sampling(greedy=True))
        cached = model.generate(prompt, 2 * bs + 3, use_cache=True, **greedy)
        assert torch.equal(cached, model.generate(prompt, 2 * bs + 3, use_cache=False, **greedy))


def _sliding_window_attention(window):
    """The torch kernel set with attention restricted to the last `window` keys of each query
    (full-sequence forward, Tq == Tk): what a rolling cache computes at every layer."""
    def attention(q, k, v, *, causal=True, scale=None, q_lengths=None, kv_lengths=None,
                  rel_bias=None, alibi_slopes=None):
        assert causal and q_lengths is None and kv_lengths is None and q.shape[2] == k.shape[2]
        i = torch.arange(q.shape[2])[:, None]
        j = torch.arange(k.shape[2])[None, :]
        band = (j <= i) & (j > i - window)
        mask = torch.zeros(band.shape, dtype=q.dtype).masked_fill(~band, float("-inf"))
        if rel_bias is not None or alibi_slopes is not None:
            mask = mask + explicit_position_bias((j - i)[None, None], rel_bias, alibi_slopes)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    return dataclasses.replace(KERNELS["torch"], attention=attention)


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_rolling_cache_equals_sliding_window_attention(name, kernels):
    """Two layers: cached decoding past the context equals one forward over the whole sequence
    in which every layer attends to the last block_size positions (absolute rotary angles up to
    the sequence's length)."""
    cfg = CONFIGS[name]
    model = make_model(cfg, kernels, spread=0.3).eval()
    tokens = rand_tokens(2, 3 * cfg.block_size + 5)
    reference = twin(model, "torch").eval()
    banded = _sliding_window_attention(cfg.block_size)
    for m in reference.modules():
        if isinstance(m, KernelModule):
            m.kern = banded
    with torch.no_grad():
        rolled = _rolling_logits(model, tokens, 5)
        full = reference(tokens[:, :-1]).logits[:, 4:]
    close(rolled, full, TOL, "rolling vs sliding window", rel_to_max=True)


def test_full_rolling_cache_takes_one_position_at_a_time():
    model = make_model(ROTARY).eval()
    _, cache = model.prefill(rand_tokens(1, 16))
    with pytest.raises(ValueError, match="one position at a time"):
        model.step(rand_tokens(1, 2), cache)
    assert cache.length == cache.position == 16  # a refused step leaves the cache as it was
    model.step(rand_tokens(1, 1), cache)
    assert cache.length == 16 and cache.position == 17
    with pytest.raises(ValueError, match="one position at a time"):
        model.prefill(rand_tokens(1, 17))  # longer than the window


def test_tables_grown_while_generating_still_train():
    """Generation (under inference_mode) past the context grows the rotary tables; training
    afterwards still works with them."""
    model = make_model(ROTARY)
    model.generate(rand_tokens(1, 4), 2 * ROTARY.block_size)
    rotary = model.blocks[0].attn.rotary
    assert rotary.cos.shape[0] >= 2 * ROTARY.block_size and not rotary.cos.is_inference()
    model(rand_tokens(2, 8), rand_tokens(2, 8, seed=2)).loss.backward()


def test_relu_mlp():
    mlp = MLP(8, 32, activation="relu")
    x = torch.randn(3, 8)
    close(mlp(x), mlp.proj(torch.relu(mlp.fc(x))), dict(atol=0, rtol=0), "relu")
    with pytest.raises(ValueError, match="activation"):
        MLP(8, 32, activation="tanh")


@pytest.mark.parametrize("kwargs, word", [
    (dict(pos_encoding="rotary", rotary_dim=3), "rotary_dim"),
    (dict(pos_encoding="rotary", rotary_dim=34), "rotary_dim"),
    (dict(pos_encoding="rotary", rotary_dim=-2), "rotary_dim"),
    (dict(pos_encoding="rotary", n_embd=30, n_head=2), "rotary_dim"),  # odd head, all of it
    (dict(rope_base=1.0), "rope_base"),
    (dict(activation="tanh"), "activation"),
])
def test_bad_config_raises(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ModelConfig(**{**dict(n_embd=32, n_head=2), **kwargs})


def test_old_configs_get_the_defaults():
    """A config saved before these fields existed loads with learned positions and GELU."""
    saved = to_dict(TINY)
    for key in ("rotary_dim", "rope_base", "activation"):
        del saved[key]
    cfg = config_from_dict(ModelConfig, saved)
    assert (cfg.rotary_dim, cfg.rope_base, cfg.activation) == (0, 10000.0, "gelu")
    assert ModelConfig(pos_encoding="rotary", n_embd=32, n_head=2).rotary_width == 16
