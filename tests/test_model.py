"""The GPT model: our kernels against the PyTorch reference path (forward, gradients, training),
the KV cache against re-running the window, the `seed` preset's exact architecture, sampling,
and the model's input checks. Tiny configs only, so the whole module runs in seconds."""

import dataclasses

import pytest
import torch

import pygpt.generation
from helpers import close
from pygpt.config import ModelConfig, TrainConfig, preset
from pygpt.generation import window_start
from pygpt.model import GPT
from pygpt.sampling import Sampling, next_token
from pygpt.train import lr_at, make_optimizer

V = 23  # vocabulary of the random-token tests

TINY = ModelConfig(vocab_size=V, block_size=16, n_layer=2, n_head=2, n_embd=32)

# Architectures every equivalence test runs on: the default block, fixed sinusoidal positions,
# no biases / untied head with a bias, and the `seed` preset's shape (no MLP, residual, W_O,
# block norms; an embedding norm and std-1 embeddings) at a small vocabulary.
ARCHS = {
    "learned": TINY,
    "sinusoidal": dataclasses.replace(TINY, pos_encoding="sinusoidal"),
    "untied-nobias": dataclasses.replace(TINY, bias=False, tie_weights=False, head_bias=True,
                                         n_layer=1, n_head=4),
    "seed": dataclasses.replace(preset("seed").model, vocab_size=V),
}


def make_model(cfg, kernels="ext", seed=0, spread=0.0):
    """A model from a fixed seed. `spread` adds N(0, spread) noise to every parameter, so that
    attention is far from uniform and logits are well separated (random init at std 0.02 makes
    every attention row nearly uniform, which would hide a wrong mask or scale)."""
    torch.manual_seed(seed)
    model = GPT(cfg, kernels=kernels)
    if spread:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * spread)
    return model


def twin(model, kernels):
    """A copy of model (same weights) running on the other kernels."""
    other = GPT(model.config, kernels=kernels)
    other.load_state_dict(model.state_dict())
    return other


def rand_tokens(B, T, vocab=V, seed=1):
    return torch.randint(vocab, (B, T), generator=torch.Generator().manual_seed(seed))


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
    x = rand_tokens(2, 16)
    a = model(x).logits
    model.kernels = "torch"
    assert model.kernels == "torch"
    b = model(x).logits
    close(a, b, dict(atol=1e-5, rtol=1e-5), "logits after switching", rel_to_max=True)
    with pytest.raises(ValueError, match="unknown kernels"):
        model.kernels = "cuda-magic"
    with pytest.raises(ValueError, match="unknown kernels"):
        GPT(TINY, kernels="nope")


# --- (b) ext == torch over 20 training steps --------------------------------------------------

def _train_losses(kernels, cfg, tcfg, steps, data):
    """The trainer's step (lr schedule, grad clip, AdamW groups) on fixed batches."""
    torch.manual_seed(tcfg.seed)
    model = GPT(cfg, kernels=kernels)
    model.train()
    optimizer = make_optimizer(model, tcfg)
    gen = torch.Generator().manual_seed(tcfg.seed)
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, tcfg)
        starts = torch.randint(len(data) - cfg.block_size - 1, (8,), generator=gen)
        x = torch.stack([data[s:s + cfg.block_size] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + cfg.block_size] for s in starts])
        loss = model(x, y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
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
    """pygpt.train.train() end to end on both kernels: the same eval losses."""
    from pygpt.train import train

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


# --- (c) KV cache == re-running the window ----------------------------------------------------

@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_prefill_decode_matches_full_forward(arch, kernels):
    """Logits of a prefill plus one-token decode steps through `past` equal the logits of one
    full forward at every position (each position sees exactly the same keys)."""
    cfg = ARCHS[arch]
    model = make_model(cfg, kernels, spread=0.3).eval()
    T = cfg.block_size
    idx = rand_tokens(2, T)
    full = model(idx).logits
    for prefill in (1, T // 2, T - 1):
        logits, _, cache = model(idx[:, :prefill], use_cache=True)
        steps = [logits]
        assert len(cache) == cfg.n_layer
        assert cache[0][0].shape == (2, cfg.n_head, prefill, cfg.n_embd // cfg.n_head)
        for t in range(prefill, T):
            logits, loss, cache = model(idx[:, t:t + 1], past=cache, use_cache=True)
            assert loss is None and logits.shape == (2, 1, cfg.vocab_size)
            steps.append(logits)
        close(torch.cat(steps, dim=1), full, dict(atol=1e-4, rtol=1e-4),
              f"prefill {prefill} + decode", rel_to_max=True)
    # A full cache leaves no room: the next position would exceed the context.
    with pytest.raises(ValueError, match="context"):
        model(idx[:, :1], past=cache)


def test_forward_without_use_cache_returns_no_cache():
    model = make_model(TINY).eval()
    assert model(rand_tokens(1, 4)).present is None
    assert model(rand_tokens(1, 4), use_cache=True).present is not None


def _record_logits(monkeypatch):
    """Patches the sampler that pygpt.generation calls so every step's logits are recorded."""
    record = []

    def recording(logits, sampling, generator=None):
        record.append(logits.detach().clone())
        return next_token(logits, sampling, generator)

    monkeypatch.setattr(pygpt.generation, "next_token", recording)
    return record


def _reference_greedy(model, idx, n):
    """Greedy generation written from the documented window rule, without the cache: the window
    grows to block_size tokens, then restarts at the last block_size // 2 tokens."""
    bs = model.config.block_size
    tokens = idx
    start = max(0, idx.shape[1] - bs)
    for _ in range(n):
        if tokens.shape[1] - start > bs:
            start = tokens.shape[1] - max(1, bs // 2)
        logits = model(tokens[:, start:]).logits[:, -1]
        tokens = torch.cat([tokens, logits.argmax(-1, keepdim=True)], dim=1)
    return tokens


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_cached_generation_matches_uncached(arch, kernels, monkeypatch):
    """Greedy generation well past block_size (the window slides several times): the KV-cache
    path picks the same tokens as re-running the window, with per-step logits within 1e-4."""
    cfg = ARCHS[arch]
    model = make_model(cfg, kernels, spread=0.3).eval()
    n_new = 3 * cfg.block_size + 5
    for prompt_len, B in [(1, 1), (5, 2), (cfg.block_size + 3, 1)]:  # also a prompt > block_size
        idx = rand_tokens(B, prompt_len, vocab=cfg.vocab_size)
        record = _record_logits(monkeypatch)
        cached = model.generate(idx, n_new, sampling=Sampling(greedy=True), use_cache=True)
        logits_cached = record[:]
        record.clear()
        uncached = model.generate(idx, n_new, sampling=Sampling(greedy=True), use_cache=False)
        logits_uncached = record[:]
        assert cached.shape == (B, prompt_len + n_new)
        assert torch.equal(cached[:, :prompt_len], idx)
        assert torch.equal(cached, uncached), f"prompt {prompt_len}: tokens differ"
        assert len(logits_cached) == len(logits_uncached) == n_new
        for step, (a, b) in enumerate(zip(logits_cached, logits_uncached)):
            close(a, b, dict(atol=1e-4, rtol=1e-4), f"prompt {prompt_len} step {step}",
                  rel_to_max=True)
        monkeypatch.undo()
        assert torch.equal(uncached, _reference_greedy(model, idx, n_new))


def test_window_start_rule():
    bs = 8
    assert window_start(0, 8, bs) == 0  # a full window still fits
    assert window_start(0, 9, bs) == 5  # 9 tokens: restart at the last 4
    assert window_start(5, 13, bs) == 5
    assert window_start(5, 14, bs) == 10
    assert window_start(0, 2, 1) == 1  # block_size 1 keeps one token


def test_generate_keeps_training_mode_and_rejects_bad_prompt():
    model = make_model(TINY)
    model.train()
    model.generate(rand_tokens(1, 3), 2)
    assert model.training
    model.eval()
    model.generate(rand_tokens(1, 3), 2)
    assert not model.training
    with pytest.raises(ValueError, match="at least one token"):
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    with pytest.raises(ValueError):
        model.generate(torch.zeros(3, dtype=torch.long), 3)
    assert torch.equal(model.generate(rand_tokens(1, 3), 0), rand_tokens(1, 3))


# --- (d) the `seed` preset's architecture -----------------------------------------------------

def test_seed_preset_parameters():
    cfg = dataclasses.replace(preset("seed").model, vocab_size=65)
    model = GPT(cfg)
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    assert shapes == {
        "tok_emb.weight": (65, 60),
        "embed_norm.weight": (60,),
        "embed_norm.bias": (60,),
        "blocks.0.attn.q.weight": (60, 60),
        "blocks.0.attn.k.weight": (60, 60),
        "blocks.0.attn.v.weight": (60, 60),
        "lm_head.weight": (65, 60),
        "lm_head.bias": (65,),
    }
    # The sinusoidal table is a fixed, unsaved buffer; nothing else is in the state dict.
    assert set(model.state_dict()) == set(shapes)
    assert model.num_params() == 65 * 60 + 2 * 60 + 3 * 60 * 60 + 65 * 60 + 65
    assert model.lm_head.weight.data_ptr() != model.tok_emb.weight.data_ptr()  # untied
    std = model.tok_emb.weight.std().item()
    assert 0.9 < std < 1.1, std
    assert torch.all(model.embed_norm.weight == 1) and torch.all(model.embed_norm.bias == 0)
    assert torch.all(model.lm_head.bias == 0)
    # Trained by plain SGD at a constant learning rate.
    tcfg = preset("seed").train
    assert (tcfg.optimizer, tcfg.weight_decay, tcfg.grad_clip) == ("sgd", 0.0, 0.0)
    assert lr_at(0, tcfg) == lr_at(tcfg.max_iters // 2, tcfg) == lr_at(10 ** 6, tcfg) == tcfg.lr


def test_default_model_init():
    """Tied head, N(0, 0.02) embeddings, residual projections scaled down by depth."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=65, n_layer=4, n_embd=128))
    assert model.lm_head.weight is model.tok_emb.weight
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.blocks[0].mlp.proj.weight.std().item() == pytest.approx(0.02 / 8 ** 0.5, rel=0.1)
    assert model.blocks[0].attn.q.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_preset_copies_are_independent():
    p = preset("baby")
    p.model.n_layer = 99
    p.train.lr = 5.0
    assert preset("baby").model.n_layer == 4 and preset("baby").train.lr == 1e-3
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


# --- (e) a tiny model overfits a short text ---------------------------------------------------

def test_tiny_model_overfits_short_text(tmp_path):
    """Via pygpt.train.train(): a few hundred steps on a short text drive the train loss near
    zero. Every character of the text determines the next one, so zero loss is reachable even at
    the first position of a window."""
    from pygpt.train import train

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
    character is determined), through our kernels' loss and backward."""
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
        loss = model(x, y).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    assert model(x, y).loss.item() < 0.1


# --- (f) sampling -----------------------------------------------------------------------------

def _logits(B=64, V_=50, seed=5):
    return torch.randn(B, V_, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    logits = _logits()
    assert torch.equal(next_token(logits, Sampling(greedy=True)), logits.argmax(-1))


@pytest.mark.parametrize("sampling", [Sampling(top_k=1), Sampling(top_p=1e-6),
                                      Sampling(top_k=1, temperature=5.0),
                                      Sampling(top_p=1e-9, temperature=3.0)],
                         ids=["top_k=1", "top_p=1e-6", "top_k=1,T=5", "top_p=1e-9,T=3"])
def test_degenerate_sampling_is_greedy(sampling):
    logits = _logits()
    for seed in range(5):
        gen = torch.Generator().manual_seed(seed)
        assert torch.equal(next_token(logits, sampling, gen), logits.argmax(-1))


def test_seed_reproduces_and_differs():
    logits = _logits()
    s = Sampling(temperature=1.5, top_k=20, top_p=0.95)
    a = next_token(logits, s, torch.Generator().manual_seed(11))
    b = next_token(logits, s, torch.Generator().manual_seed(11))
    c = next_token(logits, s, torch.Generator().manual_seed(12))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)
    # The same through model.generate.
    model = make_model(TINY, spread=0.3)
    idx = rand_tokens(2, 3)
    g1 = model.generate(idx, 40, sampling=s, generator=torch.Generator().manual_seed(3))
    g2 = model.generate(idx, 40, sampling=s, generator=torch.Generator().manual_seed(3))
    assert torch.equal(g1, g2)


def test_top_k_and_top_p_support():
    """Samples only ever come from the k most likely tokens / the smallest nucleus reaching p."""
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    logits = probs.log().expand(2000, 4)
    gen = torch.Generator().manual_seed(0)
    top2 = next_token(logits, Sampling(top_k=2), gen)
    assert set(top2.tolist()) == {1, 3}
    nucleus = next_token(logits, Sampling(top_p=0.75), gen)  # 0.5 + 0.3 reaches 0.75
    assert set(nucleus.tolist()) == {1, 3}
    nucleus = next_token(logits, Sampling(top_p=0.85), gen)  # needs the 0.15 too
    assert set(nucleus.tolist()) == {1, 2, 3}
    everything = next_token(logits, Sampling(top_k=10, top_p=1.0), gen)
    assert set(everything.tolist()) == {0, 1, 2, 3}
    # Frequencies follow the probabilities (loose bound: 2000 samples).
    freq = torch.bincount(everything, minlength=4).float() / 2000
    torch.testing.assert_close(freq, probs[0], atol=0.05, rtol=0)


def test_low_temperature_approaches_greedy():
    logits = _logits()
    got = next_token(logits, Sampling(temperature=1e-3), torch.Generator().manual_seed(0))
    assert torch.equal(got, logits.argmax(-1))


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=-1.0),
                                    dict(temperature=float("nan")), dict(top_k=0),
                                    dict(top_k=-3), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_p=-0.1), dict(top_p=float("nan"))],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_bad_sampling_values_raise(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        Sampling(**kwargs)


# --- (g) input checks and modes ---------------------------------------------------------------

def test_forward_past_block_size_raises():
    model = make_model(TINY)
    with pytest.raises(ValueError, match=r"17 positions exceed the context length 16"):
        model(rand_tokens(1, 17))
    _, _, cache = model(rand_tokens(1, 10), use_cache=True)
    with pytest.raises(ValueError, match="context"):
        model(rand_tokens(1, 7), past=cache)
    model(rand_tokens(1, 6), past=cache)  # exactly fills the context: fine
    with pytest.raises(ValueError, match="batch, time"):
        model(torch.zeros(16, dtype=torch.long))
    with pytest.raises(ValueError, match="layers"):
        model(rand_tokens(1, 1), past=cache[:1])


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
    (dict(pos_encoding="rotary"), "pos_encoding"),
    (dict(n_layer=0), "n_layer"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(dropout=1.0), "dropout"),
    (dict(dropout=-0.1), "dropout"),
])
def test_bad_model_config_raises(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ModelConfig(**kwargs)
