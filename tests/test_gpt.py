"""The GPT model: our kernels against the PyTorch reference path (forward, gradients, training
steps and the training loop), prefill plus decode steps through a KVCache against one full
forward, the `seed` preset's exact architecture and the default initialisation, overfitting, and
the model's input and config checks. Tiny configs only, so the whole module runs in seconds.
Decoding (generation, the window rule, sampling) is in test_decoding.py; the building blocks on
their own in test_nn.py."""

import dataclasses

import pytest
import torch

from helpers import ARCHS, TINY, V, close, make_model, rand_tokens, twin
from pygpt.config import ModelConfig, TrainConfig
from pygpt.positions import RELATIVE_ENCODINGS
from pygpt.config.presets import preset
from pygpt.data.text import LMBatch
from pygpt.kernels import KERNELS
from pygpt.families import build
from pygpt.models import GPT, GPTOutput
from pygpt.nn import KVCache, LayerNorm, MultiHeadAttention
from pygpt.training import lr_at, make_optimizer, train, train_step


# --- (a) ext == torch: logits, loss, gradients ------------------------------------------------

@pytest.mark.parametrize("spread", [0.0, 0.3], ids=["init", "spread"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_ext_matches_torch_forward_backward(arch, spread):
    cfg = ARCHS[arch]
    ext = make_model(cfg, "ext", spread=spread)
    ref = twin(ext, "torch")
    x, y = rand_tokens(3, cfg.block_size), rand_tokens(3, cfg.block_size, seed=2)
    out_e, out_t = ext(x, y), ref(x, y)
    close(out_e.logits, out_t.logits, dict(atol=1e-5, rtol=1e-5), "logits", rel_to_max=True)
    close(out_e.loss, out_t.loss, dict(atol=1e-5, rtol=1e-5), "loss")
    out_e.loss.backward()
    out_t.loss.backward()
    grads_t = dict(ref.named_parameters())
    for name, p in ext.named_parameters():
        g_ref = grads_t[name].grad
        assert p.grad is not None and g_ref is not None, name
        close(p.grad, g_ref, dict(atol=1e-5, rtol=1e-4), f"grad {name}", rel_to_max=True)


def test_ext_matches_torch_short_and_batched_inputs():
    """Lengths other than block_size (including 1) and batch sizes 1 and 5."""
    ext = make_model(TINY, "ext", spread=0.3)
    ref = twin(ext, "torch")
    for B, T in [(1, 1), (1, 7), (5, 3), (2, 16)]:
        x = rand_tokens(B, T)
        close(ext(x).logits, ref(x).logits, dict(atol=1e-5, rtol=1e-5), f"logits B={B} T={T}",
              rel_to_max=True)


def test_switching_kernels_in_place():
    model = make_model(TINY, "ext", spread=0.3)
    # The layers that call kernels: the final norm, and per block two norms and the attention.
    kernel_layers = [m for m in model.modules() if isinstance(m, (LayerNorm, MultiHeadAttention))]
    assert len(kernel_layers) == 1 + 3 * TINY.n_layer
    assert all(m.kern is KERNELS["ext"] for m in kernel_layers)
    x = rand_tokens(2, 16)
    a = model(x).logits
    model.kernels = "torch"
    assert model.kernels == "torch"
    # Every layer inside switched, not just the model's own name.
    assert all(m.kernels == "torch" and m.kern is KERNELS["torch"] for m in kernel_layers)
    b = model(x).logits
    close(a, b, dict(atol=1e-5, rtol=1e-5), "logits after switching", rel_to_max=True)
    with pytest.raises(ValueError, match="unknown kernels"):
        model.kernels = "cuda-magic"
    assert model.kernels == "torch"  # a refused name changes nothing
    with pytest.raises(ValueError, match="unknown kernels"):
        GPT(TINY, kernels="nope")


def test_build_picks_the_model_by_arch():
    model = build(TINY, kernels="torch")
    assert type(model) is GPT and model.kernels == "torch" and model.config is TINY
    cfg = dataclasses.replace(TINY)
    cfg.arch = "t5"  # past the config's own check, as a hand-built object could be
    with pytest.raises(ValueError, match="unknown model family 't5'"):
        build(cfg)


@pytest.mark.parametrize("arch", ["gpt", "bert", "seq2seq"])
def test_every_family_takes_norm_eps_and_the_tanh_gelu_everywhere(arch):
    """Every layer norm of each family (embedding, blocks, final, BERT's head) has the config's
    norm_eps, and every GELU (the MLPs', BERT's head's) its activation's approximation."""
    from pygpt.models.bert import MaskedLMHead
    from pygpt.nn import MLP

    for activation, approximate, eps in [("gelu", "none", 1e-5), ("gelu_tanh", "tanh", 1e-12)]:
        cfg = ModelConfig(arch=arch, vocab_size=V, block_size=8, n_layer=2, n_head=2, n_embd=16,
                          embed_norm=True, activation=activation, norm_eps=eps)
        model = build(cfg)
        norms = [m for m in model.modules() if isinstance(m, LayerNorm)]
        gelus = [m for m in model.modules() if isinstance(m, (MLP, MaskedLMHead))]
        assert len(norms) >= 6 and {m.eps for m in norms} == {eps}, arch
        assert len(gelus) >= 2 and {m.approximate for m in gelus} == {approximate}, arch


# --- (b) ext == torch over 20 training steps --------------------------------------------------

def _train_losses(kernels, cfg, tcfg, steps, data):
    """The trainer's step (pygpt.training.train_step: lr schedule, grad clip, AdamW groups) on
    fixed batches."""
    torch.manual_seed(tcfg.seed)
    model = GPT(cfg, kernels=kernels)
    model.train()
    optimizer = make_optimizer(model, tcfg)
    gen = torch.Generator().manual_seed(tcfg.seed)
    losses = []
    for step in range(steps):
        starts = torch.randint(len(data) - cfg.block_size - 1, (8,), generator=gen)
        x = torch.stack([data[s:s + cfg.block_size] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + cfg.block_size] for s in starts])
        losses.append(train_step(model, optimizer, [LMBatch(x, y)], lr_at(step, tcfg),
                                 tcfg.grad_clip))
    return losses, model


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_training_steps_ext_match_torch(dropout):
    """Same seed, same data: 20 AdamW steps give the same losses (and weights) on both kernels.
    With dropout the masks come from the same global RNG stream, so they agree too."""
    cfg = dataclasses.replace(TINY, dropout=dropout)
    tcfg = TrainConfig(lr=3e-3, warmup_iters=5, max_iters=20, seed=7)
    data = rand_tokens(1, 400, seed=3)[0]
    losses_e, model_e = _train_losses("ext", cfg, tcfg, 20, data)
    losses_t, model_t = _train_losses("torch", cfg, tcfg, 20, data)
    assert losses_e[-1] < losses_e[0] - 0.05, f"did not learn: {losses_e}"
    torch.testing.assert_close(torch.tensor(losses_e), torch.tensor(losses_t), atol=1e-4, rtol=0)
    params_t = dict(model_t.named_parameters())
    for name, p in model_e.named_parameters():
        torch.testing.assert_close(p, params_t[name], atol=1e-4, rtol=1e-4, msg=name)


def test_train_function_ext_matches_torch(tmp_path):
    """pygpt.training.train() end to end on both kernels: the same eval losses."""
    text = tmp_path / "t.txt"
    text.write_text("".join(chr(97 + (i * 7 + i // 13) % 26) for i in range(600)) + "\n")
    results = {}
    for kernels in ("ext", "torch"):
        tcfg = TrainConfig(data=str(text), out=str(tmp_path / kernels), batch_size=4,
                           max_iters=20, eval_interval=20, eval_iters=2, warmup_iters=2,
                           lr=3e-3, kernels=kernels, seed=3)
        model_cfg = ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16)
        results[kernels] = train(model_cfg, tcfg, progress=False)
    for key in ("train_loss", "val_loss"):
        assert results["ext"][key] == pytest.approx(results["torch"][key], abs=1e-4), key


# --- (c) prefill + decode steps through the KV cache == one full forward ---------------------

@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_prefill_decode_matches_full_forward(arch, kernels):
    """Logits of a prefill plus one-token decode steps through the cache equal the logits of one
    full forward at every position (each position sees exactly the same keys)."""
    cfg = ARCHS[arch]
    model = make_model(cfg, kernels, spread=0.3).eval()
    T = cfg.block_size
    idx = rand_tokens(2, T)
    full = model(idx).logits
    for prefill in (1, T // 2, T - 1):
        logits, cache = model.prefill(idx[:, :prefill])
        steps = [logits]
        assert isinstance(cache, KVCache) and len(cache) == cfg.n_layer
        assert cache.length == prefill
        assert cache[0].k.shape == cache[0].v.shape == (2, cfg.n_head, prefill, cfg.head_dim)
        for t in range(prefill, T):
            logits = model.step(idx[:, t:t + 1], cache)
            assert logits.shape == (2, 1, cfg.vocab_size)
            assert cache.length == t + 1  # extended in place
            steps.append(logits)
        close(torch.cat(steps, dim=1), full, dict(atol=1e-4, rtol=1e-4),
              f"prefill {prefill} + decode", rel_to_max=True)
    if cfg.pos_encoding not in RELATIVE_ENCODINGS:  # (those roll: tests/test_rotary_model.py)
        # A full cache leaves no room: the next position would exceed the context.
        with pytest.raises(ValueError, match="context"):
            model.step(idx[:, :1], cache)


def test_forward_extends_only_a_given_cache():
    """Without a cache the output is just logits and loss; a cache passed in is extended in
    place by the call's positions (and the loss is still only there with targets)."""
    model = make_model(TINY).eval()
    out = model(rand_tokens(1, 4))
    assert isinstance(out, GPTOutput) and out._fields == ("logits", "loss") and out.loss is None
    cache = model.new_cache()
    assert len(cache) == TINY.n_layer and cache.length == 0
    out = model(rand_tokens(1, 4), cache=cache)
    assert out.loss is None and out.logits.shape == (1, 4, V)
    assert cache.length == 4
    out = model(rand_tokens(1, 2), rand_tokens(1, 2, seed=2), cache=cache)
    assert out.loss is not None and cache.length == 6
    assert all(layer.length == 6 for layer in cache.layers)


# --- (d) the `seed` preset's architecture, the default init, presets --------------------------

def test_seed_preset_parameters():
    cfg = dataclasses.replace(preset("seed").model, vocab_size=65)
    model = GPT(cfg)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "embed.tok.weight": (65, 60),
        "embed.norm.weight": (60,),
        "embed.norm.bias": (60,),
        "blocks.0.attn.qkv.weight": (180, 60),  # W_Q, W_K, W_V stacked: one matmul
        "lm_head.weight": (65, 60),
        "lm_head.bias": (65,),
    }
    # The sinusoidal table is a fixed, unsaved buffer; nothing else is in the state dict.
    assert set(model.state_dict()) == set(shapes)
    assert model.num_params() == 65 * 60 + 2 * 60 + 3 * 60 * 60 + 65 * 60 + 65
    assert model.lm_head.weight.data_ptr() != model.embed.tok.weight.data_ptr()  # untied
    std = model.embed.tok.weight.std().item()
    assert 0.9 < std < 1.1, std
    assert torch.all(model.embed.norm.weight == 1) and torch.all(model.embed.norm.bias == 0)
    assert torch.all(model.lm_head.bias == 0)
    # Trained by plain SGD at a constant learning rate.
    tcfg = preset("seed").train
    assert (tcfg.optimizer, tcfg.weight_decay, tcfg.grad_clip) == ("sgd", 0.0, 0.0)
    assert lr_at(0, tcfg) == lr_at(tcfg.max_iters // 2, tcfg) == lr_at(10 ** 6, tcfg) == tcfg.lr


def test_default_model_init():
    """Tied head, N(0, 0.02) embeddings, residual projections scaled down by depth."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=65, n_layer=4, n_embd=128))
    assert model.lm_head.weight is model.embed.tok.weight
    assert model.embed.tok.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / 8 ** 0.5, rel=0.1)
    assert model.blocks[0].attn.proj.weight.std().item() == pytest.approx(0.02 / 8 ** 0.5, rel=0.1)
    for weight in model.blocks[0].attn.qkv.weight.split(128):  # W_Q, W_K, W_V each
        assert weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_preset_copies_are_independent():
    p = preset("baby")
    p.model.n_layer = 99
    p.train.lr = 5.0
    assert preset("baby").model.n_layer == 4 and preset("baby").train.lr == 1e-3
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


# --- (e) a tiny model overfits a short text ---------------------------------------------------

def test_tiny_model_overfits_short_text(tmp_path):
    """Via pygpt.training.train(): a few hundred steps on a short text drive the train loss near
    zero. Every character of the text determines the next one, so zero loss is reachable even at
    the first position of a window."""
    line = "abcdefghijklmnopqrstuvwxyz.,;:!?-+ABCDEFGHIJ\n"
    text = tmp_path / "short.txt"
    text.write_text(line * 12)
    tcfg = TrainConfig(data=str(text), out=str(tmp_path / "out"), batch_size=8, max_iters=250,
                       eval_interval=250, eval_iters=4, warmup_iters=10, lr=1e-2, min_lr=1e-3,
                       weight_decay=0.0, seed=0)
    model_cfg = ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=32)
    result = train(model_cfg, tcfg, progress=False)
    assert result["step"] == 250
    assert result["train_loss"] < 0.1, result
    assert result["val_loss"] < 0.1, result


def test_overfit_one_batch_sentence():
    """A model memorises one fixed batch of real-text windows (given its window, every next
    character is determined), through our kernels' loss and backward and the trainer's step."""
    text = "To be, or not to be, that is the question: Whether 'tis nobler in the mind"
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text])
    cfg = ModelConfig(vocab_size=len(chars), block_size=24, n_layer=2, n_head=2, n_embd=32)
    torch.manual_seed(0)
    model = GPT(cfg)
    starts = [0, 17, 33, 49]
    x = torch.stack([data[s:s + 24] for s in starts])
    y = torch.stack([data[s + 1:s + 25] for s in starts])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    for _ in range(150):
        train_step(model, opt, [LMBatch(x, y)], lr=1e-2, grad_clip=0.0)
    assert model(x, y).loss.item() < 0.1


# --- (f) input checks, modes and config errors ------------------------------------------------

def test_forward_past_block_size_raises():
    model = make_model(TINY)
    with pytest.raises(ValueError, match=r"17 positions exceed the context length 16"):
        model(rand_tokens(1, 17))
    _, cache = model.prefill(rand_tokens(1, 10))
    with pytest.raises(ValueError, match="context"):
        model.step(rand_tokens(1, 7), cache)
    assert cache.length == 10  # a refused step leaves the cache as it was
    model.step(rand_tokens(1, 6), cache)  # exactly fills the context: fine
    assert cache.length == 16
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(16, dtype=torch.long))
    _, cache = model.prefill(rand_tokens(1, 10))
    one_layer = KVCache.from_tensors(cache.tensors()[:1])
    with pytest.raises(ValueError, match="layers"):
        model(rand_tokens(1, 1), cache=one_layer)


def test_dropout_model_eval_is_deterministic():
    cfg = dataclasses.replace(TINY, dropout=0.3)
    model = make_model(cfg, spread=0.3)
    x = rand_tokens(2, 16)
    model.eval()
    a, b = model(x).logits, model(x).logits
    assert torch.equal(a, b)
    # ... and equals the same weights with dropout 0.
    no_drop = GPT(TINY)
    no_drop.load_state_dict(model.state_dict())
    close(a, no_drop.eval()(x).logits, dict(atol=1e-6, rtol=1e-6), "eval vs no-dropout model")
    model.train()
    c, d = model(x).logits, model(x).logits
    assert not torch.equal(c, d)
    assert not torch.equal(c, a)


@pytest.mark.parametrize("kwargs, word", [
    (dict(n_embd=30, n_head=4), "divisible"),
    (dict(pos_encoding="xpos"), "pos_encoding"),
    (dict(n_layer=0), "n_layer"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
    (dict(arch="t5"), "arch"),
    (dict(norm="sandwich"), "norm"),
    (dict(num_labels=-1), "num_labels"),
    (dict(norm_eps=0.0), "norm_eps"),
    (dict(norm_eps=-1e-5), "norm_eps"),
    (dict(norm_eps=float("inf")), "norm_eps"),
    (dict(norm_eps=float("nan")), "norm_eps"),
    (dict(activation="gelu_new"), "activation"),
])
def test_bad_model_config_raises(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ModelConfig(**kwargs)


def test_head_dim():
    assert ModelConfig(n_embd=60, n_head=5).head_dim == 12
    assert TINY.head_dim == 16
