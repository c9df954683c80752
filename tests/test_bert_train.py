"""BERT through the command lines: `python -m pygpt.train --arch bert` pretrains on a text
(masked-LM + next-sentence, WordPiece by default, char with special tokens too), writes a
checkpoint that loads as a BERT, resumes exactly, and `python -m pygpt.fill_mask` fills masks
from it; generate refuses it clearly (its ONNX export: tests/test_export_bert.py). Tiny models, a
few steps each."""

import json

import pytest
import torch

import pygpt
import pygpt.fill_mask
import pygpt.generate
import pygpt.train
from helpers import metrics, state_dicts_equal
from pygpt.models import BERT
from pygpt.storage.run_files import CONFIG

SHAPE = ["--n-layer", "1", "--n-embd", "32", "--n-head", "2", "--block-size", "32",
         "--batch-size", "8", "--eval-iters", "2", "--quiet"]


def train_cli(args):
    pygpt.train.main(args)


@pytest.fixture(scope="module")
def bert_run(text_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("bert") / "run"
    train_cli(["--arch", "bert", "--data", str(text_file), "--out", str(out), "--vocab-size", "300",
               "--max-iters", "6", "--eval-interval", "3", *SHAPE])
    return out


def test_pretraining_writes_a_bert_checkpoint(bert_run):
    config = json.loads((bert_run / CONFIG).read_text())
    assert config["model"]["arch"] == "bert" and config["train"]["tokenizer"] == "wordpiece"
    assert config["model"]["norm"] == "post"  # the bert-baby preset's, under the flags given
    model, tokenizer = pygpt.load(bert_run)
    assert isinstance(model, BERT) and model.config.vocab_size == tokenizer.vocab_size
    assert set(tokenizer.special_tokens) == {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}
    records = metrics(bert_run)
    assert [r["step"] for r in records] == [3, 6]
    for key in ("train_loss", "val_loss", "val_mlm_loss", "val_mlm_acc", "val_nsp_acc"):
        assert key in records[-1], key
    assert 0.0 <= records[-1]["val_mlm_acc"] <= 1.0 and records[-1]["tokens"] > 0


def test_resume_equals_straight(text_file, tmp_path):
    """A BERT run stopped at step 3 and resumed to 6 ends with the weights of 6 straight (data
    order, masks and dropout all come back)."""
    common = ["--arch", "bert", "--tokenizer", "char", "--data", str(text_file),
              "--eval-interval", "3", "--dropout", "0.1", *SHAPE]
    train_cli([*common, "--out", str(tmp_path / "straight"), "--max-iters", "6"])
    train_cli([*common, "--out", str(tmp_path / "split"), "--max-iters", "3"])
    train_cli(["--resume", "--out", str(tmp_path / "split"), "--max-iters", "6", "--quiet"])
    straight, _ = pygpt.load(tmp_path / "straight")
    split, _ = pygpt.load(tmp_path / "split")
    state_dicts_equal(straight.state_dict(), split.state_dict())
    assert metrics(tmp_path / "straight")[-1]["val_loss"] == metrics(tmp_path / "split")[-1]["val_loss"]


def test_no_nsp_and_char_tokenizer(text_file, tmp_path):
    out = tmp_path / "mlm-only"
    train_cli(["--arch", "bert", "--no-nsp", "--tokenizer", "char", "--data", str(text_file),
               "--out", str(out), "--max-iters", "2", "--eval-interval", "2", *SHAPE])
    model, tokenizer = pygpt.load(out)
    assert model.nsp is None and "[MASK]" in tokenizer.special_tokens
    assert "val_nsp_acc" not in metrics(out)[-1] and "val_mlm_acc" in metrics(out)[-1]


def test_fill_mask(bert_run, capsys):
    model, tokenizer = pygpt.load(bert_run)
    fills = pygpt.fill_mask.fill_mask(model, tokenizer, "First [MASK]: before we [MASK]", top_k=3)
    assert len(fills) == 2 and all(len(f) == 3 for f in fills)
    for candidates in fills:
        probs = [p for _, p in candidates]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    # The CLI prints one line per mask, the same candidates.
    pygpt.fill_mask.main(["--ckpt", str(bert_run), "--text", "First [MASK]: before we [MASK]",
                          "--top-k", "3"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("[MASK] 1: ") and repr(fills[0][0][0]) in lines[0]


def test_fill_mask_agrees_with_the_model_on_a_batch(bert_run):
    """fill_mask's probabilities are the masked-LM head's softmax at the mask position."""
    model, tokenizer = pygpt.load(bert_run)
    text = "Citizen: [MASK] you"
    fills = pygpt.fill_mask.fill_mask(model, tokenizer, text, top_k=1)
    sp = tokenizer.special_tokens
    ids = torch.tensor([[sp["[CLS]"], *tokenizer.encode(text, parse_specials=True), sp["[SEP]"]]])
    with torch.no_grad():
        logits = model(ids).mlm_logits[0]
    at = int((ids[0] == sp["[MASK]"]).nonzero())
    best = logits[at].softmax(-1).max()
    assert fills[0][0][1] == pytest.approx(best.item(), rel=1e-5)


@pytest.mark.parametrize("text, pattern", [("no mask here", "no \\[MASK\\]"),
                                           ("[MASK] " * 40, "at most 32")])
def test_fill_mask_bad_text(bert_run, text, pattern):
    with pytest.raises(SystemExit, match="error: .*" + pattern):
        pygpt.fill_mask.main(["--ckpt", str(bert_run), "--text", text])


def test_generate_refuses_a_bert_and_fill_mask_refuses_a_gpt(bert_run, trained):
    with pytest.raises(SystemExit, match="error: .*bert model, which does not generate"):
        pygpt.generate.main(["--ckpt", str(bert_run), "--prompt", "a"])
    with pytest.raises(SystemExit, match="error: .*needs a bert checkpoint"):
        pygpt.fill_mask.main(["--ckpt", str(trained[0]), "--text", "a [MASK]"])
