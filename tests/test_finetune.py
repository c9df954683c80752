"""Fine-tuning with `--init-from SRC --data OTHER --out DST`: the new run starts from SRC's
weights and tokenizer, writes only DST (SRC stays byte-identical), keeps SRC's model shape (only
--dropout may change), refuses --out equal to SRC, and a char model refuses a text with
characters it lacks, listing them."""

import contextlib
import hashlib
import io
import json
import os
from pathlib import Path

import pytest
import torch

import pygpt
import pygpt.train
from pygpt.config import TrainConfig
from pygpt.config.fields import config_from_dict
from pygpt.data.text import SHIPPED_TEXT, TokenFile
from pygpt.models import GPT
from pygpt.training import evaluate, lr_at
from pygpt.tasks import LanguageModelling

SHAPE = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "16"]
RUN = ["--eval-iters", "2", "--batch-size", "4", "--quiet"]


def train_cli(args):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        pygpt.train.main(args + ["--json"])
    return json.loads(buf.getvalue().strip().splitlines()[-1])


def folder_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder (hidden ones too), by relative path."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def state_dicts_equal(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """(source text file, other text file): the other is a different part of Shakespeare with
    every character the source lacks blanked, so the source's char tokenizer covers it."""
    folder = tmp_path_factory.mktemp("texts")
    full = SHIPPED_TEXT.read_text(encoding="utf-8")
    source = full[:3000]
    alphabet = set(source)
    other = "".join(c if c in alphabet else " " for c in full[10000:13000])
    assert other != source[: len(other)]
    (folder / "source.txt").write_text(source, encoding="utf-8")
    (folder / "other.txt").write_text(other, encoding="utf-8")
    return folder / "source.txt", folder / "other.txt"


@pytest.fixture(scope="module")
def src(texts, tmp_path_factory):
    """A char model trained with a large learning rate and a seed of its own, so its weights
    are far from what a fresh model (of the fine-tuning run's seed) would start with."""
    out = tmp_path_factory.mktemp("src") / "src"
    train_cli(SHAPE + RUN + ["--data", str(texts[0]), "--out", str(out), "--max-iters", "12",
                             "--eval-interval", "12", "--lr", "1e-2", "--warmup-iters", "2",
                             "--seed", "7"])
    return out


def test_fine_tune_starts_from_source_weights(src, texts, tmp_path):
    """With a learning rate of 0 (warmup and schedule included) one step changes nothing, so
    the fine-tuned weights must be the source's bit for bit, and its first evaluation on the new
    text must equal the source model's loss there. A fresh model (what the run would train
    without loading) is far from both, so neither check can pass by accident."""
    before = folder_digest(src)
    dst = tmp_path / "dst"
    result = train_cli(RUN + ["--init-from", str(src), "--data", str(texts[1]), "--out", str(dst),
                              "--max-iters", "1", "--eval-interval", "1", "--lr", "0"])
    assert folder_digest(src) == before

    cfg = config_from_dict(TrainConfig, json.loads((dst / "config.json").read_text())["train"])
    assert cfg.init_from == str(src) and cfg.lr == 0 and cfg.warmup_iters > 0
    assert all(lr_at(step, cfg) == 0.0 for step in range(cfg.max_iters + 1))
    assert result["lr"] == 0.0

    source_model, source_tok = pygpt.load(src)
    tuned_model, _ = pygpt.load(dst)
    assert state_dicts_equal(tuned_model.state_dict(), source_model.state_dict())

    # The first evaluation is the source model's loss on the new text.
    task = LanguageModelling(TokenFile.load(texts[1], source_tok), source_model.config.block_size)
    expected = evaluate(source_model, task, cfg)
    assert result["val_loss"] == pytest.approx(expected["val_loss"], abs=1e-6)
    assert result["train_loss"] == pytest.approx(expected["train_loss"], abs=1e-6)

    # Not by accident: without loading, the run would start from this fresh model.
    torch.manual_seed(cfg.seed)
    fresh = GPT(source_model.config)
    assert not state_dicts_equal(fresh.state_dict(), source_model.state_dict())
    assert (fresh.embed.tok.weight - source_model.embed.tok.weight).abs().max() > 0.05
    fresh_loss = evaluate(fresh, task, cfg)["val_loss"]
    assert abs(fresh_loss - result["val_loss"]) > 0.1


def test_fine_tune_writes_only_its_own_folder(src, texts, tmp_path):
    before = folder_digest(src)
    names_before = sorted(os.listdir(src))
    dst = tmp_path / "dst"
    result = train_cli(RUN + ["--init-from", str(src), "--data", str(texts[1]), "--out", str(dst),
                              "--max-iters", "4", "--eval-interval", "2", "--lr", "3e-3",
                              "--warmup-iters", "1", "--dropout", "0.1"])
    assert result["step"] == 4
    # The source is untouched, file for file and byte for byte (nothing added either).
    assert folder_digest(src) == before and sorted(os.listdir(src)) == names_before
    # The fine-tuned run has its own complete checkpoint with the source's tokenizer and model
    # (only the dropout changed, as asked).
    assert (dst / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    src_cfg = json.loads((src / "config.json").read_text())
    dst_cfg = json.loads((dst / "config.json").read_text())
    assert dst_cfg["model"] == {**src_cfg["model"], "dropout": 0.1}
    assert dst_cfg["train"]["init_from"] == str(src)
    assert dst_cfg["train"]["data"] == str(texts[1])
    assert [json.loads(l)["step"] for l in (dst / "metrics.jsonl").read_text().splitlines()] == [2, 4]
    tuned, _ = pygpt.load(dst)
    source, _ = pygpt.load(src)
    assert not state_dicts_equal(tuned.state_dict(), source.state_dict())  # it trained

    # Resuming the fine-tuned run continues it, and still leaves the source alone.
    result = train_cli(["--resume", "--out", str(dst), "--max-iters", "6", "--quiet"])
    assert result["step"] == 6
    assert folder_digest(src) == before


def test_char_model_refuses_new_characters(src, texts, tmp_path):
    before = folder_digest(src)
    alphabet = set(texts[0].read_text(encoding="utf-8"))
    new = ["😀", "€", "ß", "Ω"]
    assert not alphabet & set(new)
    novel = tmp_path / "novel.txt"
    novel.write_text(texts[1].read_text(encoding="utf-8") + " ".join(new) * 3 + "\n",
                     encoding="utf-8")
    dst = tmp_path / "dst"
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(RUN + ["--init-from", str(src), "--data", str(novel), "--out", str(dst),
                                "--max-iters", "2", "--eval-interval", "2"])
    message = str(info.value.code)
    assert message.startswith("error: ") and "not in the tokenizer's vocabulary" in message
    assert "4 character(s)" in message
    for c in new:
        assert repr(c) in message, (c, message)
    assert not dst.exists()
    assert folder_digest(src) == before
    assert not [n for n in os.listdir(tmp_path) if ".tokens." in n]  # no partial token cache


def test_bpe_model_fine_tunes_on_text_with_new_characters(texts, tmp_path):
    """Byte-level BPE has no unknown characters: the fine-tuning text may have any."""
    src_bpe = tmp_path / "src"
    train_cli(SHAPE + RUN + ["--tokenizer", "bpe", "--vocab-size", "300", "--data",
                             str(texts[0]), "--out", str(src_bpe), "--max-iters", "2",
                             "--eval-interval", "2"])
    before = folder_digest(src_bpe)
    novel = tmp_path / "novel.txt"
    novel.write_text(texts[1].read_text(encoding="utf-8") + "Zürich 😀 世界 ß Ω\n" * 20,
                     encoding="utf-8")
    dst = tmp_path / "dst"
    result = train_cli(RUN + ["--init-from", str(src_bpe), "--data", str(novel), "--out",
                              str(dst), "--max-iters", "2", "--eval-interval", "2"])
    assert result["step"] == 2
    assert (dst / "tokenizer.json").read_bytes() == (src_bpe / "tokenizer.json").read_bytes()
    assert folder_digest(src_bpe) == before


def test_tokenizer_flag_with_init_from_is_refused_or_recorded_truthfully(src, texts, tmp_path):
    dst = tmp_path / "dst"
    try:
        pygpt.train.main(RUN + ["--init-from", str(src), "--tokenizer", "bpe", "--data",
                                str(texts[1]), "--out", str(dst), "--max-iters", "1",
                                "--eval-interval", "1"])
    except SystemExit as e:  # refusing the flag is one right answer
        assert "--tokenizer" in str(e.code)
        return
    recorded = json.loads((dst / "config.json").read_text())["train"]["tokenizer"]
    actual = json.loads((dst / "tokenizer.json").read_text()).get("kind", "bpe")
    assert recorded == actual == "char"  # the other: record the tokenizer really used


@pytest.mark.parametrize("spelling", ["same", "dotted", "symlink"])
def test_init_from_equal_to_out_is_refused(src, texts, tmp_path, spelling):
    before = folder_digest(src)
    out = {"same": str(src), "dotted": str(src.parent / "." / ".." / src.parent.name / src.name),
           "symlink": str(tmp_path / "link")}[spelling]
    if spelling == "symlink":
        os.symlink(src, out)
    args = RUN + ["--init-from", str(src), "--data", str(texts[1]), "--max-iters", "2",
                  "--eval-interval", "2", "--out", out]
    with pytest.raises(SystemExit, match="--init-from and --out must differ"):
        pygpt.train.main(args + ["--overwrite"])
    with pytest.raises(SystemExit):  # without --overwrite it is refused as well
        pygpt.train.main(args)
    assert folder_digest(src) == before


@pytest.mark.parametrize("flag", [["--n-layer", "2"], ["--n-embd", "32"], ["--n-head", "4"],
                                  ["--block-size", "8"], ["--vocab-size", "300"],
                                  ["--no-bias"], ["--pos-encoding", "sinusoidal"],
                                  ["--no-tie-weights"]])
def test_changing_the_model_shape_is_refused(src, texts, tmp_path, flag):
    dst = tmp_path / "dst"
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(RUN + flag + ["--init-from", str(src), "--data", str(texts[1]),
                                       "--out", str(dst), "--max-iters", "2"])
    message = str(info.value.code)
    assert "--init-from keeps the source model's shape" in message
    name = flag[0].replace("--no-", "--")
    assert name in message, message
    assert not dst.exists()


def test_several_shape_flags_are_all_named(src, texts, tmp_path):
    with pytest.raises(SystemExit, match=r"--n-embd.*--n-layer|--n-layer.*--n-embd"):
        pygpt.train.main(RUN + ["--n-layer", "3", "--n-embd", "32", "--dropout", "0.1",
                                "--init-from", str(src), "--data", str(texts[1]),
                                "--out", str(tmp_path / "dst")])


def test_missing_source_is_a_clear_error(texts, tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint folder"):
        pygpt.train.main(RUN + ["--init-from", str(tmp_path / "nope"), "--data", str(texts[1]),
                                "--out", str(tmp_path / "dst")])


def test_linear_schedule():
    """BERT's fine-tuning schedule: linear warmup, then straight down to min_lr at the end."""
    cfg = TrainConfig(lr=1e-3, min_lr=0.0, warmup_iters=10, schedule="linear", max_iters=110)
    assert lr_at(4, cfg) == pytest.approx(5e-4) and lr_at(10, cfg) == pytest.approx(1e-3)
    assert lr_at(60, cfg) == pytest.approx(5e-4) and lr_at(85, cfg) == pytest.approx(2.5e-4)
    assert lr_at(110, cfg) == 0.0 and lr_at(10 ** 6, cfg) == 0.0

