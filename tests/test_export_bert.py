"""The ONNX export of BERT checkpoints and the torch-free runner's fill-mask and classification:
a tiny pretrained BERT (WordPiece) and a tiny classifier on pairs (char tokenizer), exported once
each (fp32 and int8), must give PyTorch's logits in onnxruntime on padded batches of any batch
size and length, and the runner must print what pygpt.fill_mask and pygpt.classify print, in a
process where torch cannot be imported; the pretrained BERT also with the tanh GELU and another
layer norm epsilon."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from helpers import RUNNER_COMMAND, torch_free_env
import pygpt
import pygpt.classify
import pygpt.fill_mask
import pygpt.train
from pygpt import export as exporter
from pygpt.onnx.bert import padded_batch
from pygpt.data.labelled import Encoded, Example
from pygpt.data.common import truncate_pair
from pygpt.storage.run_files import RUNNER_CONFIG
from pygpt_runtime import command as runner_command, onnx_bert
from test_classify import run, zebra_rows
from test_labelled_data import write

SHAPE = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
         "--batch-size", "8", "--eval-iters", "2", "--quiet"]
LENGTHS = [[32], [7, 1, 19], [3, 30, 12, 1, 5], [1]]  # batch sizes 1, 3, 5 and 1; all padded


def pair_rows(n, seed):
    """The zebra task of test_classify, each text cut into a pair after its third word."""
    return [(label, " ".join(text.split()[:3]), " ".join(text.split()[3:]))
            for label, text in zebra_rows(n, seed)]


def pretrained(text_file, root, flags=()):
    """(checkpoint, export) of a BERT pretrained a few steps, WordPiece tokenizer."""
    pygpt.train.main(["--arch", "bert", "--data", str(text_file), "--out", str(root / "ckpt"),
                      "--vocab-size", "300", "--max-iters", "6", "--eval-interval", "6", *SHAPE,
                      *flags])
    exporter.export(root / "ckpt", root / "onnx", quantize="int8")
    return root / "ckpt", root / "onnx"


@pytest.fixture(scope="module")
def mlm(text_file, tmp_path_factory):
    return pretrained(text_file, tmp_path_factory.mktemp("bert-export"))


@pytest.fixture(scope="module")
def mlm_gelu_tanh(text_file, tmp_path_factory):
    """As mlm, with the tanh GELU (blocks and masked-LM head) and a layer norm epsilon far from
    the default (so a graph that dropped either would not match)."""
    ckpt, onnx_dir = pretrained(text_file, tmp_path_factory.mktemp("bert-export"),
                                ["--activation", "gelu_tanh", "--norm-eps", "0.1"])
    config = pygpt.load(ckpt)[0].config
    assert (config.activation, config.norm_eps) == ("gelu_tanh", 0.1)  # the flags were taken
    return ckpt, onnx_dir


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """(checkpoint, export) of a classifier of text pairs, char tokenizer."""
    root = tmp_path_factory.mktemp("cls-export")
    data = write(root / "train.tsv", ("label", "text", "text_pair"), pair_rows(200, 1))
    pygpt.train.main(["--arch", "bert", "--task", "classify", "--tokenizer", "char", "--data",
                      str(data), "--out", str(root / "ckpt"), "--lr", "2e-3", "--max-iters", "40",
                      "--eval-interval", "40", *SHAPE])
    exporter.export(root / "ckpt", root / "onnx", quantize="int8")
    return root / "ckpt", root / "onnx"


def session(onnx_dir, name="model.onnx"):
    import onnxruntime as ort

    return ort.InferenceSession(str(onnx_dir / name), providers=["CPUExecutionProvider"])


def test_files_and_runner_config(mlm, classifier):
    import onnx

    for (ckpt, onnx_dir), task in [(mlm, "fill-mask"), (classifier, "classify")]:
        assert sorted(p.name for p in onnx_dir.iterdir()) == [
            "model.int8.onnx", "model.onnx", "runner.json", "tokenizer.json"]
        config = json.loads((onnx_dir / RUNNER_CONFIG).read_text())
        model, tokenizer = pygpt.load(ckpt)
        assert config["family"] == "bert" and config["task"] == task
        assert config["block_size"] == 32 and config["vocab_size"] == model.config.vocab_size
        assert config["special_tokens"] == tokenizer.special_tokens
        assert config["tokenizer"] == {"kind": tokenizer.kind, "file": "tokenizer.json"}
        assert config["labels"] == (["no", "yes"] if task == "classify" else None)
        assert config["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
        assert config["outputs"] == ["logits"]
        graph = onnx.load(str(onnx_dir / "model.onnx"))
        onnx.checker.check_model(graph)
        assert {node.domain for node in graph.graph.node} <= {"", "ai.onnx"}
    assert json.loads((classifier[1] / RUNNER_CONFIG).read_text())["tokenizer"]["kind"] == "char"
    assert json.loads((mlm[1] / RUNNER_CONFIG).read_text())["tokenizer"]["kind"] == "wordpiece"


@pytest.mark.parametrize("which", ["mlm", "mlm_gelu_tanh", "classifier"])
def test_logits_match_pytorch_on_padded_batches(which, request):
    ckpt, onnx_dir = request.getfixturevalue(which)
    model, _ = pygpt.load(ckpt)
    run = session(onnx_dir)
    for seed, lengths in enumerate(LENGTHS):
        batch = padded_batch(model.config.vocab_size, lengths, seed=seed + 10)
        with torch.no_grad():
            out = model(batch["input_ids"], segment_ids=batch["token_type_ids"],
                        lengths=torch.tensor(lengths))
        got = run.run(None, {k: v.numpy() for k, v in batch.items()})[0]
        if which != "classifier":
            real = batch["attention_mask"].numpy().astype(bool)
            assert got.shape == (len(lengths), max(lengths), model.config.vocab_size)
            np.testing.assert_allclose(got[real], out.mlm_logits.numpy()[real], atol=1e-4, rtol=0)
        else:
            assert got.shape == (len(lengths), 2)
            np.testing.assert_allclose(got, out.logits.numpy(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("which", ["mlm", "mlm_gelu_tanh", "classifier"])
def test_int8_runs_and_stays_close(which, request):
    _, onnx_dir = request.getfixturevalue(which)
    size = {name: (onnx_dir / name).stat().st_size for name in ("model.onnx", "model.int8.onnx")}
    assert size["model.int8.onnx"] < 0.8 * size["model.onnx"]
    vocab = json.loads((onnx_dir / RUNNER_CONFIG).read_text())["vocab_size"]
    feeds = {k: v.numpy() for k, v in padded_batch(vocab, [9, 4, 16], seed=3).items()}
    p32, p8 = (torch.from_numpy(session(onnx_dir, name).run(None, feeds)[0]).softmax(-1).numpy()
               for name in ("model.onnx", "model.int8.onnx"))
    assert np.abs(p32 - p8).sum(-1).max() < 0.2  # total variation distance x 2


def test_runner_tokenizer_is_pygpts(mlm, classifier):
    """Special names in text are text unless parse_specials, and each id decodes alike."""
    for ckpt, onnx_dir in (mlm, classifier):
        _, tokenizer = pygpt.load(ckpt)
        ours = onnx_bert.OnnxBERT(str(onnx_dir)).tokenizer
        texts = (["First [MASK]: [CLS] we[SEP]", "Citizen: [MASK] you [PAD]x [MASK]"]
                 if tokenizer.kind == "wordpiece" else ["cat zebra a", "a [MASK] [SEP]"])
        for text in texts:
            for parse in (False, True):
                try:
                    expected = tokenizer.encode(text, parse_specials=parse)
                except ValueError:  # a char the char tokenizer lacks: the runner refuses too
                    with pytest.raises(ValueError):
                        ours.encode(text, parse_specials=parse)
                    continue
                assert ours.encode(text, parse_specials=parse) == expected
        assert ours.special_tokens == tokenizer.special_tokens
        for i in range(tokenizer.vocab_size):
            assert ours.decode([i]) == tokenizer.decode([i]), i


@pytest.mark.parametrize("which", ["mlm", "mlm_gelu_tanh"])
def test_fill_mask_equals_pygpts(which, request):
    ckpt, onnx_dir = request.getfixturevalue(which)
    text = "First [MASK]: before we [MASK] any further"
    model, tokenizer = pygpt.load(ckpt)
    expected = pygpt.fill_mask.fill_mask(model, tokenizer, text, top_k=4)
    got = onnx_bert.OnnxBERT(str(onnx_dir)).fill_mask(text, top_k=4)
    assert [[t for t, _ in row] for row in got] == [[t for t, _ in row] for row in expected]
    np.testing.assert_allclose([[p for _, p in row] for row in got],
                               [[p for _, p in row] for row in expected], atol=1e-5)
    args = ["--text", text, "--top-k", "4"]
    assert (run(runner_command.main, ["--model", str(onnx_dir), *args])
            == run(pygpt.fill_mask.main, ["--ckpt", str(ckpt), *args]))


def test_classify_equals_pygpts(classifier):
    ckpt, onnx_dir = classifier
    model, tokenizer, labels = pygpt.classify.load_classifier(str(ckpt))
    texts = ["cat zebra a", "the dog", "big " * 20, "a"]  # one cut to fit, rows of all lengths
    pairs = ["runs on mat", "small red blue zebra " * 3, "dog", "zebra"]
    runner_model = onnx_bert.OnnxBERT(str(onnx_dir))
    for with_pairs in (False, True):
        examples = [Example(t, p if with_pairs else None, labels[0], 1)
                    for t, p in zip(texts, pairs)]
        expected = pygpt.classify.predict(model, Encoded(examples, labels, tokenizer, 32))
        got = runner_model.classify(texts, pairs if with_pairs else None)
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)
    for args in (["--text", "a cat zebra"], ["--text", "the dog", "--text-pair", "zebra sits"]):
        assert (run(runner_command.main, ["--model", str(onnx_dir), *args])
                == run(pygpt.classify.main, ["--ckpt", str(ckpt), *args]))


def test_runner_needs_no_torch(mlm, classifier, tmp_path):
    env = torch_free_env(tmp_path)
    for onnx_dir, args in [(mlm[1], ["--text", "First [MASK]: before"]),
                           (classifier[1], ["--text", "a cat", "--text-pair", "zebra", "--int8"])]:
        done = subprocess.run([*RUNNER_COMMAND, "--model", str(onnx_dir), *args],
                              capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("[MASK] 1: ") or done.stdout.split("\n")[0] in ("yes", "no")
    probe = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True)
    assert probe.returncode != 0  # the blocker really blocks


@pytest.mark.parametrize("which, args, pattern", [
    ("mlm", ["--text", "no mask here"], "no \\[MASK\\]"),
    ("mlm", ["--text", "[MASK] " * 40], "at most 32"),
    ("mlm", ["--prompt", "First"], "takes --text"),
    ("mlm", ["--text", "a [MASK]", "--text-pair", "b"], "--text-pair is for a classifier"),
    ("classifier", ["--text", " "], "must not be empty")])
def test_runner_errors(which, args, pattern, request, capsys):
    _, onnx_dir = request.getfixturevalue(which)
    with pytest.raises(SystemExit, match="^error: .*" + pattern):
        runner_command.main(["--model", str(onnx_dir), *args])
    assert capsys.readouterr().out == ""


def test_failed_bert_export_leaves_no_file(mlm, tmp_path, monkeypatch):
    import pygpt.onnx.bert

    def disagree(*_args, **_kwargs):
        raise RuntimeError("exported model disagrees with PyTorch")

    monkeypatch.setattr(pygpt.onnx.bert, "_check_against_torch", disagree)
    with pytest.raises(RuntimeError, match="disagrees"):
        exporter.export(mlm[0], tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()  # not a file, nor the folder it created (and locked)


def test_runner_truncates_pairs_as_pygpt():
    runner_truncate = onnx_bert.truncate_pair
    for a in range(0, 40, 3):
        for b in range(0, 40, 5):
            for budget in (0, 1, 7, 29):
                assert runner_truncate(a, b, budget) == truncate_pair(a, b, budget), (a, b, budget)
