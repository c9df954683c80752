"""python -m pygpt.convert with GPT-2: tiny random GPT2LMHeadModel / GPT2Model folders made by
transformers become pygpt runs giving transformers' logits (both kernel sets), greedy tokens
(pygpt's generate and the torch-free ONNX runner), and back, bit for bit; pygpt's GPTs become
GPT2LMHeadModel folders that transformers loads without warnings."""
import dataclasses
import json

import numpy as np
import pytest
import torch

import pygpt
import pygpt.generate
from hf_helpers import TEXT, convert, gpt2_folder, import_variants, load_hf, tensors
from helpers import train_cli
from pygpt.storage import checkpoint
from pygpt.config import ModelConfig
from pygpt.decoding.sampling import Sampling
from pygpt.export import export
from pygpt.families import build
from pygpt.config.presets import preset
from pygpt.tokenizer import BPETokenizer, CharTokenizer
from pygpt_runtime import run_onnx

transformers = pytest.importorskip("transformers")

VARIANTS = {  # name -> (transformers class, config)
    "lm-gelu_new": ("GPT2LMHeadModel", {}),
    "plain-weights": ("GPT2Model", {}),
    "gelu-untied-eps": ("GPT2LMHeadModel", dict(activation_function="gelu",
                                                tie_word_embeddings=False,
                                                layer_norm_epsilon=1e-3)),
    "relu": ("GPT2LMHeadModel", dict(activation_function="relu", n_layer=1)),
    "narrow-mlp": ("GPT2LMHeadModel", dict(n_inner=48)),  # not 4 x n_embd
}


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """name -> (HF folder, its model, the pygpt run converted from it)."""
    return import_variants(tmp_path_factory, VARIANTS, gpt2_folder)


def hf_logits(model, ids):
    out = model(ids)
    if hasattr(out, "logits"):
        return out.logits
    return out.last_hidden_state @ model.wte.weight.T  # GPT2Model: the tied head's logits


@pytest.mark.parametrize("kernels", ["ext", "torch"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_logits_equal_transformers(imported, name, kernels):
    _, hf_model, run = imported[name]
    model, tokenizer = pygpt.load(run, kernels=kernels)
    ids = torch.tensor([tokenizer.encode(TEXT)[:32], tokenizer.encode(TEXT[::-1])[:32]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, hf_logits(hf_model, ids),
                                   atol=1e-5, rtol=1e-5)


def test_tokenizer_encodes_as_transformers(imported, tmp_path):
    folder, _, run = imported["lm-gelu_new"]
    ours = checkpoint.read_tokenizer(run)
    assert isinstance(ours, BPETokenizer) and ours.special_tokens == {"<|endoftext|>": 299}
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    texts = [TEXT, "  spaces,\ttabs\nand ünïcødé — 日本語 🙂", "'s 're 123 4567"]
    for text in texts:
        assert ours.encode(text) == theirs(text)["input_ids"]
        assert ours.decode(ours.encode(text)) == text
    # The same tokenizer saved as a fast tokenizer's tokenizer.json alone.
    hf = tmp_path / "fast"
    imported_model = transformers.GPT2LMHeadModel.from_pretrained(folder)
    imported_model.save_pretrained(hf)
    theirs.save_pretrained(hf)
    for name in ("vocab.json", "merges.txt"):
        (hf / name).unlink(missing_ok=True)
    assert convert("--from-hf", hf, "--out", tmp_path / "run") == (0, None)
    again = checkpoint.read_tokenizer(tmp_path / "run")
    assert [again.encode(t) for t in texts] == [ours.encode(t) for t in texts]


def test_greedy_generation_equals_transformers(imported, tmp_path, capsys):
    folder, hf_model, run = imported["lm-gelu_new"]
    model, tokenizer = pygpt.load(run)
    prompt = tokenizer.encode("ROMEO: to be")
    expected = hf_model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False,
                                 pad_token_id=0)[0, len(prompt):].tolist()
    for use_cache in (True, False):
        got = model.generate(torch.tensor([prompt]), 20, sampling=Sampling(greedy=True),
                             use_cache=use_cache)[0, len(prompt):].tolist()
        assert got == expected
    pygpt.generate.main(["--ckpt", str(run), "--prompt", "ROMEO: to be", "--greedy",
                         "--max-new-tokens", "20"])
    assert capsys.readouterr().out == "ROMEO: to be" + tokenizer.decode(expected) + "\n"
    export(run, tmp_path / "onnx", quantize=None)
    runner = list(run_onnx.stream(run_onnx.OnnxGPT(str(tmp_path / "onnx")), np.array([prompt]),
                                  20, greedy=True))
    assert [int(t[0]) for t in runner] == expected


def test_round_trip_hf_pygpt_hf_is_bit_identical(imported, tmp_path):
    for name in ("lm-gelu_new", "gelu-untied-eps"):
        folder, _, run = imported[name]
        assert convert("--to-hf", run, "--out", tmp_path / name) == (0, None)
        original, exported = tensors(folder), tensors(tmp_path / name)
        assert sorted(original) == sorted(exported)
        for key, t in original.items():
            assert torch.equal(exported[key], t), key
        hf_config = json.loads((tmp_path / name / "config.json").read_text())
        for key, value in json.loads((folder / "config.json").read_text()).items():
            if key in ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size",
                       "activation_function", "layer_norm_epsilon", "tie_word_embeddings"):
                assert hf_config[key] == value, key


def test_plain_gpt2model_weights_export_as_lm(imported, tmp_path):
    folder, hf_model, run = imported["plain-weights"]
    assert convert("--to-hf", run, "--out", tmp_path / "hf") == (0, None)
    lm = load_hf(tmp_path / "hf")
    ids = torch.tensor([[1, 5, 9, 200, 7]])
    with torch.no_grad():
        torch.testing.assert_close(lm(ids).logits, hf_logits(hf_model, ids), atol=1e-5, rtol=1e-5)


SMALL = ModelConfig(block_size=24, n_layer=2, n_head=2, n_embd=32)


def pygpt_run(folder, tokenizer, seed=0, base=SMALL, **config):
    """A pygpt run folder of a random model of base's settings and config's (weights spread far
    from their init)."""
    cfg = dataclasses.replace(base, vocab_size=tokenizer.vocab_size, **config)
    torch.manual_seed(seed)
    model = build(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    checkpoint.save(folder, model, tokenizer)
    return model


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
def test_pygpt_char_gpt_round_trip(tmp_path, activation):
    """pygpt -> HF -> pygpt: the same tensors bit for bit, the same char tokenizer; transformers
    loads the HF folder without warnings, gives the same logits and encodes the same ids."""
    tokenizer = CharTokenizer.from_text(TEXT)
    model = pygpt_run(tmp_path / "run", tokenizer, activation=activation, norm_eps=1e-6)
    assert convert("--to-hf", tmp_path / "run", "--out", tmp_path / "hf") == (0, None)
    hf_model = load_hf(tmp_path / "hf")
    ids = torch.tensor([tokenizer.encode(TEXT[:24])])
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, model.eval()(ids).logits,
                                   atol=1e-5, rtol=1e-5)
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert hf_tokenizer(TEXT)["input_ids"] == tokenizer.encode(TEXT)
    assert hf_tokenizer.decode(tokenizer.encode(TEXT)) == TEXT
    assert convert("--from-hf", tmp_path / "hf", "--out", tmp_path / "back") == (0, None)
    back, back_tokenizer = pygpt.load(tmp_path / "back")
    assert back.config == model.config
    assert back_tokenizer.to_json() == tokenizer.to_json()
    for key, t in model.state_dict().items():
        assert torch.equal(back.state_dict()[key], t), key


def test_pygpt_bpe_gpt_exports_its_tokenizer(tmp_path):
    tokenizer = BPETokenizer.train(TEXT * 4, 300)
    pygpt_run(tmp_path / "run", tokenizer, tie_weights=False)
    assert convert("--to-hf", tmp_path / "run", "--out", tmp_path / "hf") == (0, None)
    load_hf(tmp_path / "hf")
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    for text in (TEXT, "ünïcødé 🙂 and [MASK]"):
        assert hf_tokenizer(text)["input_ids"] == tokenizer.encode(text)


def test_fine_tune_an_imported_gpt2(imported, tmp_path):
    _, _, run = imported["lm-gelu_new"]
    data = tmp_path / "data.txt"
    data.write_text(TEXT * 40)
    code, message = train_cli(["--init-from", str(run), "--data", str(data), "--out",
                               str(tmp_path / "tuned"), "--max-iters", "3", "--batch-size", "2",
                               "--eval-interval", "3", "--eval-iters", "1", "--threads", "1"])
    assert (code, message) == (0, None)
    tuned, _ = pygpt.load(tmp_path / "tuned")
    assert tuned.config == pygpt.load(run)[0].config


@pytest.mark.parametrize("setting, named", [
    ({"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ({"scale_attn_weights": False}, "scale_attn_weights"),
    ({"n_inner": -1}, "n_inner"),
    ({"activation_function": "silu"}, "activation_function"),
    ({"add_cross_attention": True}, "add_cross_attention"),
    ({"architectures": ["GPT2ForSequenceClassification"]}, "GPT2ForSequenceClassification"),
    ({"model_type": "llama"}, "model_type 'llama'"),
    ({"n_head": 5}, "n_embd"),
    ({"n_embd": "wide"}, "n_embd"),
])
def test_unsupported_gpt2_configs_are_named(imported, tmp_path, setting, named):
    folder, _, _ = imported["lm-gelu_new"]
    copy = tmp_path / "hf"
    copy.mkdir()
    for path in folder.iterdir():
        copy.joinpath(path.name).write_bytes(path.read_bytes())
    config = json.loads((copy / "config.json").read_text())
    config.update(setting)
    (copy / "config.json").write_text(json.dumps(config))
    code, message = convert("--from-hf", copy, "--out", tmp_path / "run")
    assert code == 1 and message.startswith("error: ") and "\n" not in message
    assert named in message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("config, named", [
    (dict(pos_encoding="rotary"), "pos_encoding is 'rotary'"),
    (dict(pos_encoding="alibi"), "pos_encoding is 'alibi'"),
    (dict(pos_encoding="relative"), "pos_encoding is 'relative'"),
    (dict(pos_encoding="sinusoidal"), "pos_encoding is 'sinusoidal'"),
    (dict(norm="post"), "norm is 'post'"),
    (dict(head_bias=True), "head_bias"),
    (dict(bias=False), "bias is off"),
    (dict(final_norm=False), "final_norm is off"),
    (dict(base=preset("seed").model), "attn_proj is off (the seed preset's switch)"),
])
def test_gpts_gpt2_cannot_hold_are_refused(tmp_path, config, named):
    pygpt_run(tmp_path / "run", CharTokenizer.from_text(TEXT), **config)
    code, message = convert("--to-hf", tmp_path / "run", "--out", tmp_path / "hf")
    assert code == 1 and "\n" not in message and named in message, message
    assert not (tmp_path / "hf").exists()
