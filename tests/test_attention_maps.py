"""pygpt.inspect.attention_maps on tiny models of every family and position encoding, on both
kernel sets: the probabilities it forms, times V, concatenated and through W_O, give the layer's
own output (what our kernel or the reference computed without forming them); every real query's
row sums to 1 and the keys it does not see (causal mask, padding) weigh exactly 0; the score
bias is the model's relative or ALiBi bias; a text's maps in a right-padded batch are those it
has alone; a translator's default target is its greedy translation; bad input is refused."""
import dataclasses

import pytest
import torch

from helpers import ARCHS, ATTN_TOL, TINY, close, spread_
from seq2seq_helpers import CFG as MT_CFG, reverser, tokenizer as mt_tokenizer
from pygpt.config import KERNEL_SETS, ModelConfig
from pygpt.decoding.beam_search import Search
from pygpt.decoding.translate_texts import translate_texts
from pygpt.families import build
from pygpt.families import attention_maps
from pygpt.inspect.attention_picture import draw_attention
from pygpt.nn.position_bias import alibi_slopes
from pygpt.tokenizer import CharTokenizer

LETTERS = "abcdefghijklmnopqrstuvw"  # 23 characters: the GPT helpers' vocabulary
BERT = ModelConfig(arch="bert", vocab_size=len(LETTERS) + 5, block_size=16, n_layer=2, n_head=2,
                   n_embd=32, norm="post", embed_norm=True, final_norm=False)
ENCODINGS = {"learned": {}, "rotary": dict(pos_encoding="rotary"),
             "relative": dict(pos_encoding="relative", max_distance=3),
             "alibi": dict(pos_encoding="alibi", n_head=3, n_embd=24),
             "none": dict(pos_encoding="none")}
GPTS = {**ARCHS, "rotary": dataclasses.replace(TINY, pos_encoding="rotary"),
        "none": dataclasses.replace(TINY, pos_encoding="none")}
# Layers of different head counts and MLP widths (a globally pruned model's).
LAYERED = {"gpt-layered": dataclasses.replace(TINY, n_layer=3, n_head=4, qk_dim=8, v_dim=8,
                                              layer_heads=(1, 4, 2), layer_mlp_dims=(5, 128, 30)),
           "bert-layered": dataclasses.replace(BERT, n_head=3, qk_dim=8, v_dim=8,
                                               layer_heads=(3, 1))}
CONFIGS = {**LAYERED, **{f"gpt-{k}": v for k, v in GPTS.items()},
           **{f"bert-{k}": dataclasses.replace(BERT, **v) for k, v in ENCODINGS.items()},
           **{f"translator-{k}": dataclasses.replace(MT_CFG, **v)
              for k, v in {"sinusoidal": {}, **ENCODINGS}.items() if k != "learned"}}
TEXTS = {"gpt": ["abcdefgh", "wvu", "q"], "bert": ["ab[MASK]d", "wvutsrqponm", "c"],
         "translator": ["abc de", "h", "gfedcba"]}
TARGETS = ["edc ba", "hhh", None]  # the last: the model's greedy translation


def family(name):
    return name.split("-")[0]


def tokenizer_for(name):
    if family(name) == "translator":
        return mt_tokenizer()
    return CharTokenizer.from_text(LETTERS, specials=family(name) == "bert")


def model_for(name, kernels="ext"):
    torch.manual_seed(0)
    return spread_(build(CONFIGS[name], kernels=kernels), 0.3).eval()


def maps_of(model, name, texts=None):
    texts = texts or TEXTS[family(name)]
    targets = TARGETS[:len(texts)] if family(name) == "translator" else None
    return attention_maps(model, tokenizer_for(name), texts, targets)


def expected_visible(layer):
    tq, tk = len(layer.query_tokens), len(layer.key_tokens)
    full = torch.ones(tq, tk, dtype=torch.bool)
    return full.tril() if layer.causal else full


@pytest.mark.parametrize("kernels", KERNEL_SETS)
@pytest.mark.parametrize("name", CONFIGS)
def test_the_maps_through_v_and_w_o_give_the_layers_own_output(name, kernels):
    model = model_for(name, kernels)
    parts = {"gpt": ["self"], "bert": ["self"], "translator": ["encoder", "decoder", "cross"]}
    for maps in maps_of(model, name):
        assert list(maps.parts) == parts[family(name)]
        for part, layers in maps.parts.items():
            assert len(layers) == len(model.decoder if part in ("decoder", "cross") else
                                      getattr(model, "encoder", getattr(model, "blocks", None)))
            for layer in layers:
                msg = f"{name} {kernels} {part} layer {layer.layer}"
                close(layer.output, layer.module_output, ATTN_TOL[torch.float32], msg)
                close(layer.heads, layer.probs @ layer.v, ATTN_TOL[torch.float32], msg)
                assert torch.equal(layer.visible, expected_visible(layer)), msg
                assert torch.equal(layer.probs[:, ~layer.visible],
                                   torch.zeros_like(layer.probs[:, ~layer.visible])), msg
                close(layer.probs.sum(-1), torch.ones(layer.probs.shape[:2]),
                      dict(atol=1e-6, rtol=0), msg)
                assert (layer.probs >= 0).all(), msg
                # Attention is far from uniform, so that a wrong mask, scale or bias shows.
                assert layer.probs.max() > 1.5 / len(layer.key_tokens) or len(layer.key_tokens) < 2


@pytest.mark.parametrize("name", ["gpt-relative", "gpt-alibi", "bert-alibi",
                                  "translator-relative"])
def test_the_score_bias_is_the_models(name):
    model = model_for(name)
    bias_of = {"self": getattr(model, "pos_bias", None),
               "encoder": getattr(model, "enc_bias", None),
               "decoder": getattr(model, "dec_bias", None)}
    for maps in maps_of(model, name):
        for part, layers in maps.parts.items():
            for layer in layers:
                if part == "cross":
                    assert layer.bias is None
                    continue
                tq, tk = len(layer.query_tokens), len(layer.key_tokens)
                distance = torch.arange(tk)[None, :] - torch.arange(tq)[:, None]
                if "alibi" in name:
                    want = -alibi_slopes(layer.n_head)[:, None, None] * distance.abs()
                else:
                    table = bias_of[part].table.detach()
                    R = (table.shape[1] - 1) // 2
                    want = table[:, distance.clamp(-R, R) + R]
                close(layer.bias, want, dict(atol=1e-6, rtol=1e-6), f"{name} {part}")


@pytest.mark.parametrize("name", ["gpt-learned", "gpt-rotary", "bert-learned", "bert-relative",
                                  "translator-sinusoidal", "translator-alibi"])
def test_a_text_in_a_padded_batch_has_the_maps_it_has_alone(name):
    model = model_for(name)
    batch = maps_of(model, name)
    for i, maps in enumerate(batch):
        texts = TEXTS[family(name)]
        targets = [TARGETS[i]] if family(name) == "translator" else None
        alone = attention_maps(model, tokenizer_for(name), [texts[i]], targets)[0]
        assert (maps.tokens, maps.target_tokens) == (alone.tokens, alone.target_tokens)
        for part in maps.parts:
            for padded, single in zip(maps.parts[part], alone.parts[part]):
                assert padded.query_tokens == single.query_tokens
                for field in ("q", "k", "v", "scores", "probs", "heads", "output",
                              "module_output"):
                    close(getattr(padded, field), getattr(single, field),
                          dict(atol=1e-5, rtol=1e-5), f"{name} {part} {field}")
    if family(name) == "bert":
        assert batch[0].tokens == ("[CLS]", "a", "b", "[MASK]", "d", "[SEP]")


def test_the_kernel_sets_give_the_same_maps():
    ext, ref = (maps_of(model_for("bert-rotary", k), "bert-rotary") for k in KERNEL_SETS)
    for a, b in zip(ext, ref):
        for x, y in zip(a.parts["self"], b.parts["self"]):
            close(x.probs, y.probs, ATTN_TOL[torch.float32], "probs")


def test_a_translators_default_target_is_its_greedy_translation():
    """A trained model's translation, and an untrained one's, which runs to the decoder's last
    position and is cut to the positions the decoder read."""
    tok = mt_tokenizer()
    for model in (reverser(), model_for("translator-sinusoidal")):
        maps = attention_maps(model, tok, ["abc de", "gh"])
        want, _ = translate_texts(model, tok, ["abc de", "gh"], Search(beam=1))
        for m, translation in zip(maps, want):
            assert m.target_tokens[0] == "[BOS]"
            assert "".join(m.target_tokens[1:]) == translation[:MT_CFG.block_size - 1]
        cross = m.parts["cross"][0]
        assert (cross.query_tokens, cross.key_tokens) == (m.target_tokens, m.tokens)


@pytest.mark.parametrize("name,texts,targets,match", [
    ("gpt-learned", [""], None, "empty"),
    ("gpt-learned", ["a" * 17], None, "17 tokens.*at most 16"),
    ("gpt-learned", ["abcZ"], None, "not in the tokenizer's vocabulary"),
    ("bert-learned", ["a" * 15], None, "17 tokens with the specials.*at most 16"),
    ("translator-sinusoidal", ["abc"], ["a" * 16], "17 tokens with \\[BOS\\].*at most 16"),
    ("translator-sinusoidal", ["abc", "d"], ["cba"], "1 targets for 2 texts"),
    ("translator-sinusoidal", [], None, "no texts"),
])
def test_bad_input_is_refused_in_one_line(name, texts, targets, match):
    with pytest.raises(ValueError, match=match) as e:
        attention_maps(model_for(name), tokenizer_for(name), texts, targets)
    assert "\n" not in str(e.value)


def test_a_bert_needs_its_special_tokens():
    model = model_for("bert-learned")
    plain = CharTokenizer.from_text(LETTERS + "xyzAB")  # as many tokens, no specials
    with pytest.raises(ValueError, match=r"no \[CLS\], \[SEP\]"):
        attention_maps(model, plain, ["abc"])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tq,tk", [(5, 5), (2, 6), (6, 3)])
@pytest.mark.parametrize("bias", [None, "relative", "alibi"])
@pytest.mark.parametrize("padded", [False, True])
def test_attention_weights_times_v_is_the_attention(causal, tq, tk, bias, padded):
    """pygpt.ops.attention.attention_weights against the reference and our kernel, with decode
    shapes (fewer queries than keys), queries that see no key, padding and both biases."""
    from pygpt.ops.attention import attention, attention_weights, torch_attention

    B, H = 3, 2
    q, k, v = (torch.randn(B, H, t, 4, dtype=torch.float64) * 2 for t in (tq, tk, tk))
    lengths = dict(q_lengths=torch.tensor([tq, 1, max(1, tq - 2)]),
                   kv_lengths=torch.tensor([tk, 2, tk - 1])) if padded else {}
    biases = {"relative": dict(rel_bias=torch.randn(H, 5, dtype=torch.float64)),
              "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25], dtype=torch.float64)),
              None: {}}[bias]
    w = attention_weights(q, k, causal=causal, **lengths, **biases)
    real_keys = (torch.arange(tk)[None, :] < lengths["kv_lengths"][:, None] if padded
                 else torch.ones(B, tk, dtype=torch.bool))
    out = w.probs @ torch.where(real_keys[:, None, :, None], v, 0.0)
    want = torch_attention(q, k, v, causal=causal, **lengths, **biases)
    close(out, want, dict(atol=1e-10, rtol=1e-10), "reference")
    close(out.float(), attention(q.float(), k.float(), v.float(), causal=causal, **lengths,
                                 **{n: b.float() for n, b in biases.items()}),
          ATTN_TOL[torch.float32], "kernel")
    sees_a_key = w.visible.any(-1).expand(B, H, tq).double()  # else a row of zeros
    close(w.probs.sum(-1), sees_a_key, dict(atol=1e-12, rtol=0), "row sums")
    assert torch.equal(w.probs[~w.visible.expand_as(w.probs)],
                       torch.zeros_like(w.probs[~w.visible.expand_as(w.probs)]))


@pytest.mark.parametrize("name", list(LAYERED))
def test_layers_of_different_head_counts_are_drawn_head_by_head(name, tmp_path):
    """Each layer's maps hold its own heads, and the picture has a row per layer, as wide as the
    layer of most heads."""
    model = model_for(name)
    maps = maps_of(model, name)[0]
    layers = maps.parts["self"]
    assert [layer.probs.shape[0] for layer in layers] == list(model.config.layer_heads)
    path = draw_attention(layers, tmp_path / "maps.png", name)
    assert path.read_bytes().startswith(b"\x89PNG")
