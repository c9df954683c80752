"""Greedy decoding and beam search (pygpt.decoding.beam_search) against plain references that
decode one sentence at a time and re-run the decoder over the whole prefix at every step (no
cache, no batching, no row selection); beam 1 against greedy; the length limits; and a tiny
model trained here to reverse sequences, which both decoders must then translate exactly."""
import math

import pytest
import torch

from pygpt.config import ModelConfig
from pygpt.families import build
from pygpt.decoding.beam_search import Search, beam_search, greedy, translate
from pygpt_runtime.onnx_search import length_penalty

PAD, BOS, EOS = 0, 1, 2
BANNED = (PAD, BOS)
V = 19
CFG = ModelConfig(arch="seq2seq", vocab_size=V, block_size=12, n_layer=2, n_head=4, n_embd=32,
                  pos_encoding="sinusoidal")


@pytest.fixture(scope="module")
def model():
    # A seed whose model stops some greedy translations at [EOS] before the length limit and
    # some not (the noise is drawn parameter by parameter, so it depends on their layout).
    torch.manual_seed(37)
    m = build(CFG).eval()
    for p in m.parameters():
        p.data.add_(torch.randn_like(p) * 0.3)  # far from uniform next-token distributions
    return m


def sources(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (len(lengths), max(lengths)), generator=g)
    return src, torch.tensor(lengths)


def next_log_probs(model, memory, prefix):
    """Uncached: the decoder over [BOS] + prefix, for one sentence."""
    logits = model.decode(torch.tensor([[BOS] + prefix]), memory)[0, -1]
    logp = torch.log_softmax(logits.double(), dim=-1)
    logp[list(BANNED)] = -math.inf
    return logp


def reference_greedy(model, src, limit):
    memory, out = model.encode(src[None]), []
    while len(out) < limit:
        token = int(next_log_probs(model, memory, out).argmax())
        if token == EOS:
            break
        out.append(token)
    return out


def reference_beam(model, src, limit, K, alpha):
    """The documented beam search, for one sentence, by lists."""
    memory, live, finished = model.encode(src[None]), [(0.0, [])], []
    for t in range(1, limit + 1):
        candidates = sorted(((score + float(lp), seq, token) for score, seq in live
                             for token, lp in enumerate(next_log_probs(model, memory, seq))),
                            key=lambda c: -c[0])[:2 * K]
        live = []
        for rank, (score, seq, token) in enumerate(candidates):
            if token == EOS or t == limit:
                if rank < K:
                    finished.append((score / length_penalty(t, alpha),
                                     seq + ([] if token == EOS else [token])))
            elif len(live) < K:
                live.append((score, seq + [token]))
        if len(finished) >= K:
            break
    return max(finished, key=lambda f: f[0])[1]


@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_greedy_matches_the_uncached_reference(model, kernels):
    model.kernels = kernels
    src, lengths = sources([5, 1, 7, 3, 6])
    search = Search(max_extra=3)
    with torch.no_grad():
        got = greedy(model, src, lengths, BOS, EOS, search, BANNED)
        expected = [reference_greedy(model, s[:n], n + 3) for s, n in zip(src, lengths.tolist())]
    assert got == expected
    assert any(len(g) < n + 3 for g, n in zip(got, lengths.tolist()))  # some stop at [EOS]


@pytest.mark.parametrize("K, alpha", [(2, 0.0), (3, 0.6), (4, 1.5)])
def test_beam_search_matches_the_uncached_reference(model, K, alpha):
    model.kernels = "ext"
    src, lengths = sources([4, 7, 2, 5], seed=K)
    search = Search(beam=K, length_penalty=alpha, max_extra=2)
    with torch.no_grad():
        got = beam_search(model, src, lengths, BOS, EOS, search, BANNED)
        expected = [reference_beam(model, s[:n], n + 2, K, alpha)
                    for s, n in zip(src, lengths.tolist())]
    assert got == expected


@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_beam_one_is_greedy(model, kernels):
    model.kernels = kernels
    src, lengths = sources([3, 8, 1, 6, 2, 5], seed=7)
    for search in (Search(beam=1, max_extra=4), Search(beam=1, max_len=6, length_penalty=2.0)):
        with torch.no_grad():
            assert (beam_search(model, src, lengths, BOS, EOS, search, BANNED)
                    == greedy(model, src, lengths, BOS, EOS, search, BANNED))


@pytest.mark.parametrize("search, most", [
    (Search(max_len=2), lambda n: 2), (Search(beam=3, max_len=2), lambda n: 2),
    (Search(max_extra=0), lambda n: n), (Search(beam=2, max_extra=0), lambda n: n),
    (Search(max_extra=50), lambda n: CFG.block_size),
    (Search(beam=2, max_extra=50), lambda n: CFG.block_size),
])
def test_lengths_are_limited_and_banned_tokens_never_chosen(model, search, most):
    src, lengths = sources([5, 1, 9], seed=11)
    out = translate(model, src, lengths, bos=BOS, eos=EOS, search=search, banned=BANNED)
    assert [len(o) <= most(n) for o, n in zip(out, lengths.tolist())] == [True] * 3
    assert not any(t in BANNED or t == EOS for o in out for t in o)


def test_translate_restores_the_mode_and_refuses_bad_requests(model):
    model.train()
    src, lengths = sources([3, 2])
    translate(model, src, lengths, bos=BOS, eos=EOS, search=Search(beam=2))
    assert model.training
    model.eval()
    with pytest.raises(ValueError, match="beam 9 needs at least 18 tokens that may be chosen; "
                                         "the vocabulary has 17"):
        translate(model, src, lengths, bos=BOS, eos=EOS, search=Search(beam=9), banned=BANNED)
    with pytest.raises(ValueError, match="beam must be at least 1"):
        Search(beam=0)
    with pytest.raises(ValueError, match="max_len must be at least 1"):
        Search(max_len=0)
    with pytest.raises(ValueError, match=r"src_lengths must be \(2,\)"):
        translate(model, src, lengths[:1], bos=BOS, eos=EOS)


# --- a tiny model learns to reverse sequences --------------------------------------------------

N_SYMBOLS, LONGEST = 10, 12


def reversal_batch(n, g):
    """n random sequences of 1..LONGEST symbols and their reversals, as a TranslationBatch's
    fields (tgt_in [BOS] + reversal, tgt_out reversal + [EOS], -100 on padding)."""
    lengths = torch.randint(1, LONGEST + 1, (n,), generator=g)
    j = torch.arange(LONGEST)
    real = j < lengths[:, None]
    src = torch.where(real, torch.randint(3, 3 + N_SYMBOLS, (n, LONGEST), generator=g), PAD)
    rev = torch.where(real, src.gather(1, (lengths[:, None] - 1 - j).clamp(min=0)), PAD)
    tgt_in = torch.cat([torch.full((n, 1), BOS), rev], dim=1)
    tgt_out = torch.cat([rev, torch.full((n, 1), PAD)], dim=1)
    tgt_out[torch.arange(n), lengths] = EOS
    tgt_out = torch.where(torch.arange(LONGEST + 1) <= lengths[:, None], tgt_out, -100)
    return src, lengths, tgt_in, tgt_out, lengths + 1


@pytest.fixture(scope="module")
def reverser():
    torch.manual_seed(0)
    cfg = ModelConfig(arch="seq2seq", vocab_size=3 + N_SYMBOLS, block_size=LONGEST + 1,
                      n_layer=2, n_head=4, n_embd=64, pos_encoding="sinusoidal")
    model = build(cfg)
    g = torch.Generator().manual_seed(0)
    steps, warmup = 400, 40
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(
        (s + 1) / warmup, 0.5 * (1 + math.cos(math.pi * max(0, s - warmup) / (steps - warmup)))))
    for _ in range(steps):
        loss = model(*reversal_batch(64, g)).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    return model.eval(), g


@pytest.mark.parametrize("beam", [1, 4])
def test_a_tiny_model_learns_to_reverse_exactly(reverser, beam):
    model, g = reverser
    src, lengths, *_ = reversal_batch(100, torch.Generator().manual_seed(1234))
    out = translate(model, src, lengths, bos=BOS, eos=EOS, search=Search(beam=beam),
                    banned=(PAD, BOS))
    wrong = [(s[:n].tolist(), o) for s, n, o in zip(src, lengths.tolist(), out)
             if o != s[:n].flip(0).tolist()]
    assert not wrong, f"{len(wrong)} of 100 wrong, e.g. {wrong[:3]}"
