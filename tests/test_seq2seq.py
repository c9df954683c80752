"""The encoder-decoder (pygpt.models.Seq2Seq): its configuration, weight sharing, padding
invariance of the encoder and decoder on both kernel sets, ours against the PyTorch reference
(outputs and gradients), the label-smoothed loss against F.cross_entropy, query/key width
different from value width, and cached decoding against full re-runs."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from helpers import close
from pygpt.config import ModelConfig, TrainConfig
from pygpt.data.common import IGNORE_INDEX
from pygpt.families import build
from pygpt.models import Seq2Seq
from pygpt.nn.decoder_block import DecoderCache

V = 19
BASE = ModelConfig(arch="seq2seq", vocab_size=V, block_size=16, n_layer=2, n_head=4, n_embd=32,
                   pos_encoding="sinusoidal")
CONFIGS = {
    "pre-norm": BASE,
    "post-norm, untied, 3 decoder layers": dataclasses.replace(
        BASE, norm="post", final_norm=False, tie_weights=False, head_bias=True, n_dec_layer=3),
    "qk 4 wide, v 12 wide, learned positions": dataclasses.replace(
        BASE, qk_dim=4, v_dim=12, pos_encoding="learned", n_layer=1, n_dec_layer=2),
    # Score biases in the encoder's and the decoder's self-attention; rotary positions.
    "relative bias": dataclasses.replace(BASE, pos_encoding="relative", max_distance=3),
    "alibi, post-norm": dataclasses.replace(BASE, pos_encoding="alibi", norm="post",
                                            final_norm=False),
    "rotary, half of each head": dataclasses.replace(BASE, pos_encoding="rotary", rotary_dim=4),
    "tanh GELU, layer norm epsilon 1e-3": dataclasses.replace(BASE, activation="gelu_tanh",
                                                              norm_eps=1e-3),
}
TOL = dict(atol=2e-5, rtol=2e-5)  # float32 through several layers


def make(cfg, kernels="ext"):
    torch.manual_seed(0)
    model = build(cfg, kernels=kernels).eval()
    for p in model.parameters():  # every weight matters (biases start at zero)
        p.data.add_(torch.randn_like(p) * 0.02)
    return model


def padded_batch(lengths, T_lengths, seed=0):
    """Random source and target rows of the given lengths, right-padded with junk ids."""
    g = torch.Generator().manual_seed(seed)
    B = len(lengths)
    src = torch.randint(0, V, (B, max(lengths)), generator=g)
    tgt = torch.randint(0, V, (B, max(T_lengths)), generator=g)
    return src, torch.tensor(lengths), tgt, torch.tensor(T_lengths)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_a_padded_batch_gives_each_sentence_alone(name, kernels):
    model = make(CONFIGS[name], kernels)
    src, src_len, tgt, tgt_len = padded_batch([5, 2, 7, 1], [3, 6, 1, 4])
    with torch.no_grad():
        memory = model.encode(src, src_len)
        logits = model.decode(tgt, memory, src_len, tgt_lengths=tgt_len)
        for b, (n, m) in enumerate(zip(src_len.tolist(), tgt_len.tolist())):
            alone = model.encode(src[b:b + 1, :n])
            close(memory[b:b + 1, :n], alone, TOL, f"encoder row {b}")
            close(logits[b:b + 1, :m], model.decode(tgt[b:b + 1, :m], alone), TOL,
                  f"decoder row {b}")
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ours_match_the_pytorch_reference(name):
    ours, ref = make(CONFIGS[name], "ext"), make(CONFIGS[name], "torch")
    ours.train(), ref.train()  # dropout is 0: train mode only enables autograd's usual path
    src, src_len, tgt, tgt_len = padded_batch([6, 3, 1], [2, 5, 4], seed=1)
    tgt_out = torch.where(torch.arange(tgt.shape[1]) < tgt_len[:, None], tgt, IGNORE_INDEX)
    out, expected = ours(src, src_len, tgt, tgt_out, tgt_len), ref(src, src_len, tgt, tgt_out,
                                                                    tgt_len)
    real = tgt_out != IGNORE_INDEX
    close(out.logits[real], expected.logits[real], TOL, "logits")
    close(out.loss, expected.loss, TOL, "loss")
    out.loss.backward(), expected.loss.backward()
    for (name_, p), q in zip(ours.named_parameters(), ref.parameters()):
        close(p.grad, q.grad, dict(atol=1e-5, rtol=1e-4), name_, rel_to_max=True)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_loss_is_label_smoothed_cross_entropy_over_real_targets(smoothing, kernels):
    model = make(BASE, kernels)
    src, src_len, tgt, tgt_len = padded_batch([4, 2], [5, 2], seed=2)
    tgt_out = torch.where(torch.arange(tgt.shape[1]) < tgt_len[:, None], tgt.roll(1, 1),
                          IGNORE_INDEX)
    out = model(src, src_len, tgt, tgt_out, tgt_len, label_smoothing=smoothing)  # as training
    real = tgt_out != IGNORE_INDEX
    expected = F.cross_entropy(out.logits[real].double(), tgt_out[real], label_smoothing=smoothing)
    close(out.loss, expected, dict(atol=1e-5, rtol=1e-5), "loss")


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_cached_decoding_matches_full_reruns(name, kernels):
    model = make(CONFIGS[name], kernels)
    src, src_len, tgt, _ = padded_batch([5, 2, 7], [6, 6, 6], seed=3)
    with torch.no_grad():
        memory = model.encode(src, src_len)
        full = model.decode(tgt, memory, src_len)
        cache = model.new_decoder_cache()
        steps = [model.decode(tgt[:, :2], memory, src_len, cache)]  # a two-position prefill
        steps += [model.decode(tgt[:, t:t + 1], memory, src_len, cache) for t in range(2, 6)]
    assert cache.length == 6 and cache.cross_attn[0].length == memory.shape[1]
    close(torch.cat(steps, dim=1), full, TOL, "cached logits")


def test_cache_rows_can_be_reordered():
    model = make(BASE)
    src, src_len, tgt, _ = padded_batch([5, 2, 7], [4, 4, 4], seed=4)
    rows = torch.tensor([2, 0, 0])
    with torch.no_grad():
        memory = model.encode(src, src_len)
        cache = model.new_decoder_cache()
        model.decode(tgt[:, :3], memory, src_len, cache)
        cache.select(rows)
        last = model.decode(tgt[rows, 3:], memory[rows], src_len[rows], cache)
        expected = model.decode(tgt[rows], memory[rows], src_len[rows])[:, 3:]
    close(last, expected, TOL, "after select")


def test_weights_are_shared_and_shaped_by_the_config():
    model = build(CONFIGS["qk 4 wide, v 12 wide, learned positions"])
    assert model.src_embed.tok is model.tgt_embed.tok
    assert model.out.weight is model.src_embed.tok.weight
    assert len(model.encoder) == 1 and len(model.decoder) == 2
    cross = model.decoder[0].cross
    assert cross.q.weight.shape == (16, 32) and cross.proj.weight.shape == (32, 48)
    assert cross.kv.weight.shape == (16 + 48, 32) and cross.kv.widths == (16, 48)  # W_K, W_V
    untied = build(CONFIGS["post-norm, untied, 3 decoder layers"])
    assert untied.out.weight is not untied.src_embed.tok.weight and untied.out.bias is not None
    assert len(untied.decoder) == 3 and untied.encoder_norm is None
    std = model.src_embed.tok.weight.std().item()
    assert abs(std - 32 ** -0.5) < 0.02  # N(0, 1/sqrt(d)), read out times sqrt(d)
    ids = torch.tensor([[3, 4]])
    close(model.src_embed.tok(ids), model.src_embed.tok.weight[ids] * 32 ** 0.5, TOL, "scale")


@pytest.mark.parametrize("fields, message", [
    (dict(arch="gpt", n_dec_layer=2), "n_dec_layer applies to arch seq2seq only, not gpt"),
    (dict(arch="bert", n_dec_layer=2, v_dim=4), "n_dec_layer applies to arch seq2seq only, "
                                               "not bert"),
    (dict(arch="gpt", pooling="mean", nsp=False), "nsp, pooling apply to arch bert only, not gpt"),
    (dict(arch="seq2seq", num_labels=3, qk_dim=-1), "qk_dim must not be negative"),
    (dict(arch="seq2seq", num_labels=3), "num_labels applies to arch bert only, not seq2seq"),
    (dict(arch="seq2seq", v_dim=-1), "v_dim must not be negative"),
    (dict(arch="seq2seq", n_dec_layer=1.5), "n_dec_layer must be int"),
])
def test_bad_configs_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**fields)


def test_label_smoothing_is_a_training_setting():
    """The loss's smoothing lives in TrainConfig (checked there), not in the model's config."""
    with pytest.raises(ValueError, match=r"label_smoothing must be in \[0, 1\)"):
        TrainConfig(label_smoothing=1.0)
    with pytest.raises(TypeError, match="label_smoothing"):
        ModelConfig(arch="seq2seq", label_smoothing=0.1)


def test_bad_calls_are_refused():
    model = make(BASE)
    src, src_len, tgt, tgt_len = padded_batch([3, 2], [2, 2])
    memory = model.encode(src, src_len)
    with pytest.raises(ValueError, match=r"src must be \(batch, time\)"):
        model.encode(src[0])
    with pytest.raises(ValueError, match="tgt_lengths cannot be used with a cache"):
        model.decode(tgt, memory, src_len, model.new_decoder_cache(), tgt_lengths=tgt_len)
    with pytest.raises(ValueError, match="the cache has 3 layers, the decoder 2"):
        model.decode(tgt, memory, src_len, DecoderCache(3))
    with pytest.raises(ValueError, match=r"tgt_out must have tgt_in's shape \(2, 2\)"):
        model(src, src_len, tgt, tgt[:, :1])
    with pytest.raises(ValueError, match="17 positions exceed the context length 16"):
        model.decode(torch.zeros(1, 17, dtype=torch.long), memory[:1], src_len[:1])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_weights_round_trip_through_safetensors(tmp_path, name):
    """The shared embedding (and tied head) is saved once and shared again when loaded."""
    from safetensors.torch import load_model, save_model

    model = make(CONFIGS[name])
    save_model(model, str(tmp_path / "model.safetensors"))
    loaded = build(CONFIGS[name]).eval()
    load_model(loaded, str(tmp_path / "model.safetensors"))
    assert isinstance(loaded, Seq2Seq) and loaded.tgt_embed.tok is loaded.src_embed.tok
    src, src_len, tgt, tgt_len = padded_batch([3, 5], [4, 2], seed=5)
    with torch.no_grad():
        close(loaded(src, src_len, tgt, None, tgt_len).logits,
              model(src, src_len, tgt, None, tgt_len).logits, TOL, "reloaded")
