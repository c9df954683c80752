"""Training with the byte-level BPE tokenizer through the command line (`--tokenizer bpe
--vocab-size N`): the checkpoint's tokenizer.json is an HF BPE file, metrics report bits per
character consistently with the loss (for BPE and char runs), `--vocab-size` is refused for the
char tokenizer, and the BPE checkpoint generates from prompts with characters it never saw, in
PyTorch and through the ONNX export and its runner, which agree token for token."""

import contextlib
import dataclasses
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import RUNNER_COMMAND
import pygpt
import pygpt.generate
import pygpt.train
from pygpt.storage import checkpoint
from pygpt import export as exporter
from pygpt.data.text import SHIPPED_TEXT
from pygpt.decoding.sampling import Sampling
from pygpt.models import GPT
from pygpt.storage.run_files import RUNNER_CONFIG
from pygpt.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer


SHAPE = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16"]
RUN = ["--max-iters", "4", "--eval-interval", "4", "--eval-iters", "2", "--batch-size", "4",
       "--quiet"]
# Characters absent from the (ASCII) training text, of every UTF-8 length, and a prompt longer
# than the 16-token context once cut into bytes.
UNSEEN_PROMPT = "Zürich 😀 世界 e\u0301 — 👨\u200d👩\u200d👧 ROMEO:"


def train_cli(args):
    """Runs `python -m pygpt.train ARGS` in-process; returns the result line it prints."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        pygpt.train.main(args + ["--json"])
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def metrics(out):
    return [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "shakespeare.txt"
    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:4000]
    assert text.isascii()
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def bpe_run(text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bpe") / "run"
    result = train_cli(SHAPE + RUN + ["--tokenizer", "bpe", "--vocab-size", "300",
                                      "--data", str(text_file), "--out", str(out)])
    return out, result


@pytest.fixture(scope="module")
def random_bpe_ckpt(bpe_run, tmp_path_factory):
    """A checkpoint with the run's BPE tokenizer and random weights (untied LM head, weights x5).
    The barely trained model repeats one token when greedy; this one wanders over the vocabulary
    (multi-byte characters, invalid byte sequences), which makes comparing two generators
    meaningful."""
    trained, tokenizer = pygpt.load(bpe_run[0])
    torch.manual_seed(11)
    model = GPT(dataclasses.replace(trained.config, tie_weights=False))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)
    out = tmp_path_factory.mktemp("random") / "ckpt"
    checkpoint.save(out, model, tokenizer, step=0)
    return out


# --- the BPE run ------------------------------------------------------------------------------

def test_bpe_run_writes_hf_tokenizer(bpe_run, text_file):
    out, result = bpe_run
    assert result["step"] == 4
    spec = json.loads((out / "tokenizer.json").read_text(encoding="utf-8"))
    assert spec["model"]["type"] == "BPE" and len(spec["model"]["vocab"]) == 300
    assert spec["pre_tokenizer"]["type"] == "ByteLevel"
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(out / "tokenizer.json"))  # the HF library reads it as is
    ours = load_tokenizer(out / "tokenizer.json")
    assert isinstance(ours, BPETokenizer) and ours.vocab_size == 300
    text = text_file.read_text(encoding="utf-8")
    assert hf.encode(text).ids == ours.encode(text)
    config = json.loads((out / "config.json").read_text())
    assert config["model"]["vocab_size"] == 300 and config["train"]["tokenizer"] == "bpe"
    model, tok = pygpt.load(out)
    assert model.config.vocab_size == 300 and model.lm_head.weight.shape[0] == 300


def test_bpe_metrics_bits_per_character(bpe_run, text_file):
    """bpc = loss / ln 2 / (characters per token of the data); BPE tokens hold several
    characters, so bits per character are well below bits per token."""
    out, result = bpe_run
    records = metrics(out)
    assert [r["step"] for r in records] == [4] and records[-1] == result
    text = text_file.read_text(encoding="utf-8")
    tok = load_tokenizer(out / "tokenizer.json")
    chars_per_token = len(text) / len(tok.encode(text))
    assert 1.2 < chars_per_token < 4
    for split in ("train", "val"):
        loss, bpc = result[f"{split}_loss"], result[f"{split}_bpc"]
        assert math.isfinite(loss) and loss > 0
        assert bpc == pytest.approx(loss / math.log(2) / chars_per_token, rel=1e-9)
        assert bpc < loss / math.log(2) / 1.2
    assert result["val_ppl"] == pytest.approx(math.exp(result["val_loss"]))


def test_char_metrics_bits_per_character(text_file, tmp_path):
    """With one character per token, bpc is the loss in bits."""
    out = tmp_path / "char"
    result = train_cli(SHAPE + RUN + ["--data", str(text_file), "--out", str(out)])
    assert isinstance(load_tokenizer(out / "tokenizer.json"), CharTokenizer)
    for split in ("train", "val"):
        assert result[f"{split}_bpc"] == pytest.approx(result[f"{split}_loss"] / math.log(2),
                                                       rel=1e-12)
    assert metrics(out)[-1] == result


@pytest.mark.parametrize("extra", [[], ["--tokenizer", "char"]])
def test_vocab_size_with_char_tokenizer_is_refused(text_file, tmp_path, extra):
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(SHAPE + RUN + extra + ["--vocab-size", "300", "--data", str(text_file),
                                                "--out", str(out)])
    message = str(info.value.code)
    assert "--vocab-size" in message and "--tokenizer bpe" in message and "char" in message
    assert not out.exists()


@pytest.mark.parametrize("size", ["256", "100"])
def test_bpe_vocab_of_256_or_less_is_refused(text_file, tmp_path, size):
    out = tmp_path / "run"
    with pytest.raises(SystemExit, match=rf"^error: .*--vocab-size above 256.*{size}"):
        pygpt.train.main(SHAPE + RUN + ["--tokenizer", "bpe", "--vocab-size", size,
                                        "--data", str(text_file), "--out", str(out)])
    assert not out.exists()


# --- generation -------------------------------------------------------------------------------

def generate_cli(args, capsys):
    capsys.readouterr()
    pygpt.generate.main(args)
    return capsys.readouterr().out


def test_generate_from_bpe_with_unseen_characters(bpe_run, text_file, capsys):
    out, _ = bpe_run
    tok = load_tokenizer(out / "tokenizer.json")
    unseen = set(UNSEEN_PROMPT) - set(text_file.read_text(encoding="utf-8"))
    assert {"ü", "😀", "世", "\u0301", "\u200d"} <= unseen
    assert len(tok.encode(UNSEEN_PROMPT)) > 16  # longer than the context: the window slides
    text = generate_cli(["--ckpt", str(out), "--prompt", UNSEEN_PROMPT, "--max-new-tokens", "30",
                         "--greedy"], capsys)
    assert text.startswith(UNSEEN_PROMPT) and text.endswith("\n")
    assert len(text) > len(UNSEEN_PROMPT) + 1
    # Sampling works too, and is reproducible with a seed.
    args = ["--ckpt", str(out), "--prompt", "😀 世界", "--max-new-tokens", "25", "--seed", "3",
            "--temperature", "0.9", "--top-k", "50"]
    first = generate_cli(args, capsys)
    assert first.startswith("😀 世界") and generate_cli(args, capsys) == first


def test_generated_text_is_the_decoded_tokens(random_bpe_ckpt, capsys):
    """The streamed text (printed piece by piece) is the decoding of the generated tokens."""
    model, tok = pygpt.load(random_bpe_ckpt)
    ids = torch.tensor([tok.encode(UNSEEN_PROMPT)])
    tokens = model.generate(ids, 40, sampling=Sampling(greedy=True))
    new = tokens[0, ids.shape[1]:].tolist()
    assert len(set(new)) > 5  # not one repeated token
    text = generate_cli(["--ckpt", str(random_bpe_ckpt), "--prompt", UNSEEN_PROMPT,
                         "--max-new-tokens", "40", "--greedy"], capsys)
    assert text == UNSEEN_PROMPT + tok.decode(new) + "\n"


# --- ONNX export and the runner ---------------------------------------------------------------

def run_runner(onnx_dir, prompt, n):
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([*RUNNER_COMMAND, "--model", str(onnx_dir), "--prompt",
                           prompt, "--max-new-tokens", str(n), "--greedy", "--threads", "1"],
                          capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr.decode("utf-8", "replace")
    return done.stdout.decode("utf-8")


@pytest.mark.parametrize("which", ["trained", "random"])
def test_onnx_runner_greedy_equals_pygpt(bpe_run, random_bpe_ckpt, tmp_path, capsys, which):
    ckpt = bpe_run[0] if which == "trained" else random_bpe_ckpt
    onnx_dir = tmp_path / "onnx"
    exporter.export(ckpt, onnx_dir)
    runner_config = json.loads((onnx_dir / RUNNER_CONFIG).read_text())
    assert runner_config["tokenizer"]["kind"] == "bpe"
    assert (onnx_dir / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    for prompt, n in [(UNSEEN_PROMPT, 40), ("ROMEO:", 25)]:
        expected = generate_cli(["--ckpt", str(ckpt), "--prompt", prompt, "--max-new-tokens",
                                 str(n), "--greedy"], capsys)
        got = run_runner(onnx_dir, prompt, n)
        assert got == expected
        assert got.startswith(prompt)
        if which == "random":  # a varied continuation, so agreement is not by chance
            assert len(set(got[len(prompt):])) > 8, repr(got)
