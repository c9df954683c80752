"""The ONNX export of a seq2seq checkpoint (pygpt.onnx.seq2seq) and the torch-free translator
(pygpt-run; export/pygpt_runtime/onnx_seq2seq.py): a tiny translator (tests/seq2seq_helpers.py) saved
and exported once, fp32 and int8; its three graphs must give PyTorch's encoder output, first-step
and cached-step logits and caches on padded batches; the runner must print exactly what python -m
pygpt.translate prints, greedy and beam; it runs where torch cannot be imported; and failures are
clean. All of it for the default translator and for one with the tanh GELU and another layer norm
epsilon."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from helpers import RUNNER_COMMAND, torch_free_env
from seq2seq_helpers import CFG, reverser, tokenizer, words
from pygpt.storage import checkpoint
from pygpt.onnx import seq2seq as exporter
from pygpt.config import ModelConfig
from pygpt.export import export
from pygpt.families import build
from pygpt.storage.run_files import RUNNER_CONFIG, TOKENIZER
from pygpt.translate import main as translate_main
from pygpt_runtime import onnx_seq2seq

TEXTS = [*words(30, seed=5), "", "abc de", "hgfedcba abcdefgh", "  h  "]


# The default translator, and one with the tanh GELU and a layer norm epsilon far from the
# default (so a graph that dropped either would not match).
CONFIGS = {"default": CFG,
           "gelu_tanh-eps": dataclasses.replace(CFG, activation="gelu_tanh", norm_eps=0.1)}


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request, tmp_path_factory):
    """(checkpoint folder, export folder, model, the files written)."""
    root = tmp_path_factory.mktemp("mt-export")
    model = reverser(cfg=CONFIGS[request.param])
    checkpoint.save(root / "ckpt", model, tokenizer())
    written = export(root / "ckpt", root / "onnx", "int8")
    return root / "ckpt", root / "onnx", model, written


def test_the_folder_holds_the_graphs_tokenizer_and_runner_config(exported):
    _, onnx_dir, _, written = exported
    stems = ["encoder_model", "decoder_model", "decoder_with_past_model"]
    names = [f"{s}.onnx" for s in stems] + [f"{s}.int8.onnx" for s in stems]
    assert [p.name for p in written] == names + [TOKENIZER, RUNNER_CONFIG]
    assert sorted(p.name for p in onnx_dir.iterdir()) == sorted(names + [TOKENIZER, RUNNER_CONFIG])
    config = json.loads((onnx_dir / RUNNER_CONFIG).read_text())
    assert config["family"] == "seq2seq" and config["block_size"] == CFG.block_size
    session = ort.InferenceSession(str(onnx_dir / "decoder_with_past_model.onnx"))
    inputs = [i.name for i in session.get_inputs()]
    assert inputs[:4] == ["input_ids", "encoder_attention_mask", "past_key_values.0.decoder.key",
                          "past_key_values.0.decoder.value"]
    assert inputs[4:6] == ["past_key_values.0.encoder.key", "past_key_values.0.encoder.value"]
    assert [o.name for o in session.get_outputs()] == [
        "logits", *(f"present.{i}.decoder.{n}" for i in range(2) for n in ("key", "value"))]
    assert config["io"]["decoder_with_past"] == [inputs, [o.name for o in
                                                          session.get_outputs()]]


def test_the_graphs_match_pytorch_on_padded_batches(exported):
    """Encoder, the first step over [BOS] and four cached steps, batch of 3 padded sources."""
    _, onnx_dir, model, _ = exported
    runner = onnx_seq2seq.OnnxSeq2Seq(str(onnx_dir))
    g = torch.Generator().manual_seed(3)
    lengths = torch.tensor([9, 1, 5])
    mask = (torch.arange(9)[None] < lengths[:, None]).long()
    src = torch.randint(CFG.vocab_size, (3, 9), generator=g) * mask
    tgt = torch.randint(CFG.vocab_size, (3, 5), generator=g)
    with torch.no_grad():
        memory = model.encode(src, lengths)
        hidden = runner.encode(src.numpy(), mask.numpy())
        real = mask.bool().numpy()
        np.testing.assert_allclose(hidden[real], memory.numpy()[real], atol=1e-4, rtol=0)
        cache = model.new_decoder_cache()
        logits, dec, enc = runner.first_step(tgt[:, :1].numpy(), memory.numpy(), mask.numpy())
        for t in range(5):
            if t:
                logits, dec = runner.next_step(tgt[:, t:t + 1].numpy(), mask.numpy(), dec, enc)
            expected = model.decode(tgt[:, t:t + 1], memory, lengths, cache)
            np.testing.assert_allclose(logits, expected.numpy(), atol=1e-4, rtol=0)
            np.testing.assert_allclose(dec[-1], cache.self_attn[1].v.numpy(), atol=1e-4, rtol=0)
        assert dec[0].shape == (3, CFG.n_head, 5, CFG.head_dim)


@pytest.mark.parametrize("flags", [["--greedy"], [], ["--beam", "3", "--length-penalty", "1.5",
                                                      "--batch-size", "4"],
                                   ["--beam", "2", "--max-len-extra", "2"]])
def test_the_runner_translates_as_pygpt_translate(exported, tmp_path, capsys, flags):
    ckpt, onnx_dir, _, _ = exported
    src = tmp_path / "src.txt"
    src.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    translate_main(["--ckpt", str(ckpt), "--file", str(src), *flags])
    expected = capsys.readouterr().out
    onnx_seq2seq.main(["--model", str(onnx_dir), "--file", str(src), *flags])
    assert capsys.readouterr().out == expected
    lines = expected.split("\n")
    assert len(lines) == len(TEXTS) + 1 and len(set(lines)) > len(TEXTS) // 2  # varied output
    assert sum(line == text[::-1] for line, text in zip(lines, TEXTS)) >= 3  # some learned
    onnx_seq2seq.main(["--model", str(onnx_dir), "--file", str(src), "--int8", *flags])
    assert capsys.readouterr().out.count("\n") == len(TEXTS)


def test_the_runner_needs_no_torch(exported, tmp_path):
    _, onnx_dir, _, _ = exported
    env = torch_free_env(tmp_path)
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(onnx_dir), "--text",
                           "abcd", "--beam", "2"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    expected = onnx_seq2seq.OnnxSeq2Seq(str(onnx_dir)).translate(
        ["abcd"], onnx_seq2seq.Search(beam=2))
    assert done.stdout == expected[0] + "\n"
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True)
    assert probe.returncode != 0  # the blocker really blocks


def test_failures_are_clean(exported, tmp_path, monkeypatch):
    _, onnx_dir, _, _ = exported

    def broken(path):
        path.write_text("half")
        raise RuntimeError("the exporter failed")

    monkeypatch.setattr(exporter, "_builders", lambda model: {"encoder_model.onnx": broken})
    with pytest.raises(RuntimeError, match="the exporter failed"):
        exporter.export_seq2seq(reverser(steps=0), tokenizer(), tmp_path / "failed")
    assert list((tmp_path / "failed").iterdir()) == []  # nothing staged is left
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / RUNNER_CONFIG).write_text(json.dumps({"family": "gpt", "models": {}, "block_size": 8,
                                                  "tokenizer": {"kind": "char",
                                                                "file": "tokenizer.json"}}))
    for argv, message in [(["--model", str(fake), "--text", "ab"], "holds a gpt model, which "
                                                                    "does not translate"),
                          (["--model", str(tmp_path), "--text", "ab"], f"no {RUNNER_CONFIG}"),
                          (["--model", str(onnx_dir), "--text", "xyz"], "not in the model's"),
                          (["--model", str(onnx_dir), "--text", "ab", "--beam", "0"],
                           "beam must be at least 1"),
                          (["--model", str(onnx_dir), "--text", "ab", "--length-penalty",
                            "1e10"], "length_penalty must be from 0 to 10"),
                          (["--model", str(onnx_dir), "--text", "ab", "--length-penalty", "nan"],
                           "length_penalty must be from 0 to 10")]:
        with pytest.raises(SystemExit) as e:
            onnx_seq2seq.main(argv)
        assert message in e.value.code and "\n" not in e.value.code, e.value.code


@pytest.mark.parametrize("encoding", ["relative", "alibi", "rotary"])
def test_position_encodings_export(encoding, tmp_path):
    """The graphs of a translator with score-bias or rotary positions match PyTorch: the export
    runs every graph on a padded batch against the model and refuses to write on a mismatch."""
    torch.manual_seed(0)
    model = build(ModelConfig(arch="seq2seq", vocab_size=tokenizer().vocab_size, block_size=16,
                              n_layer=1, n_head=4, n_embd=32, pos_encoding=encoding,
                              max_distance=3))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))  # biases and tables away from their zero init
    files = exporter.export_seq2seq(model, tokenizer(), tmp_path / "onnx")
    assert {f.name for f in files} >= {"encoder_model.onnx", "decoder_with_past_model.onnx"}
