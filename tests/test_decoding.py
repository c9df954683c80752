"""Decoding (pygpt.decoding.sampling): generation with the KV cache against re-running the window, the
sliding-window rule, generate's modes and prompt checks, the Decoder contract on a model that is
not a GPT, and choosing the next token (greedy, temperature, top-k, top-p, seeds, bad values).
Tiny models only, so the whole module runs in seconds."""

import dataclasses

import pytest
import torch

import pygpt.decoding.sampling
from helpers import ARCHS, TINY, close, make_model, rand_tokens
from pygpt.positions import RELATIVE_ENCODINGS
from pygpt.decoding.sampling import Sampling, next_token, stream, window_keep, window_start


# --- cached generation == re-running the window -----------------------------------------------

def _record_logits(monkeypatch):
    """Patches the sampler that pygpt.decoding.sampling calls so every step's logits are recorded."""
    record = []

    def recording(logits, sampling, generator=None):
        record.append(logits.detach().clone())
        return next_token(logits, sampling, generator)

    monkeypatch.setattr(pygpt.decoding.sampling, "next_token", recording)
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
@pytest.mark.parametrize("arch", [a for a, c in ARCHS.items()
                                  if c.pos_encoding not in RELATIVE_ENCODINGS])
def test_cached_generation_matches_uncached(arch, kernels, monkeypatch):
    """Greedy generation well past block_size (the window slides several times): the KV-cache
    path picks the same tokens as re-running the window, with per-step logits within 1e-4.
    (Encodings that keep a rolling cache instead: tests/test_rotary_model.py.)"""
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
    # What a sliding window keeps: the last half-context, at least one token.
    assert [window_keep(n) for n in (1, 2, 3, 8, 9, 64)] == [1, 1, 1, 4, 4, 32]
    assert window_start(0, 10, 9) == 10 - window_keep(9) == 6


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
    model.train()
    with pytest.raises(ValueError):  # a refused prompt restores the mode too
        model.generate(torch.zeros(1, 0, dtype=torch.long), 3)
    assert model.training
    # It generates in eval mode: a model in training mode with heavy dropout decodes exactly
    # as the same model in eval mode.
    dropout = make_model(dataclasses.replace(TINY, dropout=0.5), spread=0.3)
    greedy = dict(sampling=Sampling(greedy=True))
    in_training = dropout.train().generate(rand_tokens(2, 3), 20, **greedy)
    assert dropout.training
    assert torch.equal(in_training, dropout.eval().generate(rand_tokens(2, 3), 20, **greedy))


class _CountingDecoder:
    """A Decoder that is no torch module: its logits always pick (the last token + 1) mod V, and
    it records what each prefill and step was given."""

    context_length = 6
    V = 50

    def __init__(self):
        self.calls = []

    def _logits(self, idx):
        return torch.nn.functional.one_hot((idx + 1) % self.V, self.V).float()

    def prefill(self, idx):
        self.calls.append(("prefill", idx.shape[1]))
        return self._logits(idx), {"length": idx.shape[1]}

    def step(self, idx, cache):
        assert idx.shape[1] == 1 and cache["length"] < self.context_length
        self.calls.append(("step", cache["length"]))
        cache["length"] += 1
        return self._logits(idx)


@pytest.mark.parametrize("use_cache", [True, False])
def test_stream_drives_any_decoder(use_cache):
    """pygpt.decoding.sampling.stream needs only prefill, step and context_length: with the cache one
    prefill per window and a one-token step per other new token (the cache never passes the
    context), without it a prefill of the whole window every token."""
    model = _CountingDecoder()
    idx = torch.tensor([[3], [40]])
    new = list(stream(model, idx, 12, sampling=Sampling(greedy=True), use_cache=use_cache))
    assert torch.equal(torch.stack(new, dim=1),
                       (idx + torch.arange(1, 13)) % model.V)
    if use_cache:
        # The window grows from 1 token to 6 (prefill 1, five steps); at 7 tokens it slides to
        # the last 3 (prefill 3, three steps), at 11 again (prefill 3, one step).
        assert model.calls == [("prefill", 1), *[("step", n) for n in range(1, 6)],
                               ("prefill", 3), ("step", 3), ("step", 4), ("step", 5),
                               ("prefill", 3), ("step", 3)]
    else:
        assert model.calls == [("prefill", n) for n in (1, 2, 3, 4, 5, 6, 3, 4, 5, 6, 3, 4)]


@pytest.mark.parametrize("use_cache", [True, False])
def test_stream_holds_only_the_window(use_cache, monkeypatch):
    """However long the prompt and the stream, decoding joins no token row longer than the
    context + 1 (it once kept and re-joined the whole history every token, so a long stream
    slowed down as it grew), joins one only for a prefill (none per cached step), and still
    continues the prompt's last token."""
    model = _CountingDecoder()
    widths = []

    def recording(join):
        def joined(tensors, *args, **kwargs):
            out = join(tensors, *args, **kwargs)
            widths.append(out.shape[-1])
            return out
        return joined

    monkeypatch.setattr(torch, "cat", recording(torch.cat))
    monkeypatch.setattr(torch, "stack", recording(torch.stack))
    idx = torch.arange(40)[None] % model.V
    new = list(stream(model, idx, 300, sampling=Sampling(greedy=True), use_cache=use_cache))
    monkeypatch.undo()
    prefills = sum(call == "prefill" for call, _ in model.calls)
    assert len(widths) <= prefills and max(widths) <= model.context_length + 1
    assert (prefills == 300) != use_cache  # with the cache, most tokens are steps
    assert torch.equal(torch.stack(new, dim=1)[0], (39 + torch.arange(1, 301)) % model.V)


# --- choosing the next token ------------------------------------------------------------------

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
    g3 = model.generate(idx, 40, sampling=s, generator=torch.Generator().manual_seed(4))
    assert torch.equal(g1, g2)
    assert not torch.equal(g1, g3)


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


@pytest.mark.parametrize("temperature", [1e-3, 1e-30, 1e-45, 1e-320, 5e-324])
def test_low_temperature_approaches_greedy(temperature):
    """Any positive temperature samples, however small (1e-30 and below used to turn the
    probabilities into NaN and crash the sampler): it becomes greedy, also with logits far from
    0 and with top-k / top-p, and draws evenly among tied maxima."""
    logits = _logits()
    for scale, shift in [(1, 0), (1e6, 0), (1, -1e4)]:
        for extra in [{}, dict(top_k=5), dict(top_p=0.9)]:
            sampling = Sampling(temperature=temperature, **extra)
            got = next_token(logits * scale + shift, sampling, torch.Generator().manual_seed(0))
            assert torch.equal(got, logits.argmax(-1)), (scale, shift, extra)
    tied = torch.tensor([[2.0, 5.0, 5.0, 1.0]]).expand(400, 4)
    draws = next_token(tied, Sampling(temperature=temperature), torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {1, 2}


@pytest.mark.parametrize("kwargs", [dict(temperature=0.0), dict(temperature=-1.0),
                                    dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(top_k=0),
                                    dict(top_k=-3), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_p=-0.1), dict(top_p=float("nan"))],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_bad_sampling_values_raise(kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        Sampling(**kwargs)
