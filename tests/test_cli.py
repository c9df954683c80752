"""The two command lines: `python -m pygpt.train` (flags over the preset, --resume continuing
the saved run wherever its folder moved, --overwrite, refusals that name the flag) and
`python -m pygpt.generate` (the same text as the Python API, with and without the cache;
reproducible sampling; bad options, unknown characters and damaged checkpoints exit with one
`error:` line and print nothing else). --help documents every flag of both. What a user meets at
the edges (Ctrl-C, pipes, odd values, --help's defaults) is in test_cli_edges.py."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import pygpt
import pygpt.generate
import pygpt.train
from helpers import TINY_FLAGS, edit_json, metrics
from pygpt.config import ModelConfig, TrainConfig
from pygpt.decoding.sampling import Sampling
from pygpt.storage.run_files import WEIGHTS


def help_text(main, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def assert_every_flag_documented(parser, text):
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in text, f"{flag} missing from --help"
        assert action.help and action.help.strip(), \
            f"{'/'.join(action.option_strings)} has no help text"


# --- python -m pygpt.train --------------------------------------------------------------------

def run_train_cli(args, capsys):
    pygpt.train.main(args + ["--json"])
    out = capsys.readouterr().out.strip().splitlines()
    return json.loads(out[-1])


def test_train_cli(text_file, tmp_path, capsys):
    out = tmp_path / "cli"
    args = TINY_FLAGS + ["--data", str(text_file), "--out", str(out)]
    result = run_train_cli(args, capsys)
    assert result["step"] == 5 and math.isfinite(result["val_loss"])
    config = json.loads((out / "config.json").read_text())
    assert (config["model"]["n_layer"], config["model"]["n_embd"], config["model"]["block_size"],
            config["model"]["vocab_size"]) == (1, 16, 8, 52)
    assert config["train"]["batch_size"] == 4 and config["train"]["max_iters"] == 5
    assert config["train"]["lr"] == 1e-3  # not given: from the baby preset
    weights = (out / WEIGHTS).read_bytes()

    # A second run into the same folder is refused and leaves it alone.
    with pytest.raises(SystemExit, match="already holds a checkpoint.*--resume.*--overwrite"):
        pygpt.train.main(args)
    assert (out / WEIGHTS).read_bytes() == weights

    # --resume with a model flag is refused, naming the flag.
    with pytest.raises(SystemExit, match=r"model flags cannot change.*--n-embd"):
        pygpt.train.main(["--resume", "--out", str(out), "--n-embd", "32"])
    with pytest.raises(SystemExit, match=r"--dropout"):
        pygpt.train.main(["--resume", "--out", str(out), "--dropout", "0.1"])

    # --resume with a new total continues the saved run (model and train settings from it).
    result = run_train_cli(["--resume", "--out", str(out), "--max-iters", "8", "--quiet"], capsys)
    assert result["step"] == 8
    assert [r["step"] for r in metrics(out)] == [5, 8]
    assert json.loads((out / "config.json").read_text())["train"]["max_iters"] == 8

    # --overwrite starts over (fresh metrics).
    result = run_train_cli(args + ["--overwrite", "--seed", "9"], capsys)
    assert result["step"] == 5
    assert [r["step"] for r in metrics(out)] == [5]
    assert (out / WEIGHTS).read_bytes() != weights


def test_a_run_says_what_it_trains_before_its_first_step(text_file, tmp_path, capsys):
    """Before anything slow, what the run is (its preset, shape, length, batch, number type,
    device, folder) and how it optimises; then its tokenizer, its data split and its
    parameters; then the steps."""
    out = tmp_path / "said"
    loud = [flag for flag in TINY_FLAGS if flag != "--quiet"]
    pygpt.train.main(loud + ["--data", str(text_file), "--out", str(out), "--threads", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("pygpt.train: gpt pretrain (preset baby): 1 layers, 2 heads, 16 wide, "
                        f"context 8; 5 steps of 4 x 8 tokens; float32 on cpu (1 thread); into "
                        f"{out}")
    assert lines[1] == ("  settings: AdamW, lr 0.001, betas (0.9, 0.99), weight decay 0.1; warmup "
                        "100 steps, then wsd to 0, clipping at 1")
    del lines[1]
    model, _ = pygpt.load(out)
    tokens = len(text_file.read_text(encoding="utf-8"))  # a char tokenizer: one a character
    train = int(tokens * 0.9)
    assert lines[1:4] == [
        "tokenizer: learning a char vocabulary from the data",
        f"data: {train:,} training and {tokens - train:,} validation tokens (the last tenth)",
        f"model: {sum(p.numel() for p in model.parameters()):,} parameters, vocabulary of 52 "
        "char tokens"]
    assert lines[4].startswith("step 5: ")


def test_train_cli_resume_missing_checkpoint(tmp_path):
    with pytest.raises(SystemExit, match="error: no checkpoint folder"):
        pygpt.train.main(["--resume", "--out", str(tmp_path / "nothing"), "--quiet"])


def test_train_cli_resume_moved_folder(text_file, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pygpt.train.main(TINY_FLAGS + ["--data", str(text_file), "--out", "first"])
    shutil.move("first", "out")  # the default --out
    capsys.readouterr()
    result = run_train_cli(["--resume", "--max-iters", "7", "--quiet"], capsys)
    assert result["step"] == 7
    assert json.loads(Path("out/config.json").read_text())["step"] == 7


def test_train_cli_resume_old_train_config(ckpt):
    edit_json(ckpt / "config.json", lambda c: c["train"].update(decay_lr=True))
    with pytest.raises(SystemExit, match="error: .*decay_lr"):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])


def test_train_cli_bad_flags(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(["--preset", "huge"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="error: .*divisible"):
        pygpt.train.main(["--n-embd", "30", "--n-head", "4", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(["--kernels", "cuda"])
    assert info.value.code == 2


def test_train_help_documents_every_flag(capsys):
    import dataclasses as dc

    text = help_text(pygpt.train.main, capsys)
    parser = pygpt.train.build_parser()
    assert_every_flag_documented(parser, text)
    # Every config field is a flag (vocab_size comes from the tokenizer), booleans both ways.
    for cls in (ModelConfig, TrainConfig):
        for f in dc.fields(cls):
            if f.name == "vocab_size":
                continue
            flag = "--" + f.name.replace("_", "-")
            assert flag in text, flag
            if f.type in ("bool", bool):
                assert "--no-" + f.name.replace("_", "-") in text, f.name
    for flag in ("--preset", "--resume", "--overwrite", "--quiet"):
        assert flag in text
    for name in ("baby", "shakespeare", "seed"):
        assert name in text


# --- python -m pygpt.generate -----------------------------------------------------------------

def test_generate_help_documents_every_flag(capsys):
    text = help_text(pygpt.generate.main, capsys)
    assert_every_flag_documented(pygpt.generate.build_parser(), text)


def test_generate_help_lists_every_flag(capsys):
    """The part of the check above that holds today: every flag at least appears in --help."""
    text = help_text(pygpt.generate.main, capsys)
    for action in pygpt.generate.build_parser()._actions:
        for flag in action.option_strings:
            assert flag in text, flag


def test_generate_cli(trained, capsys):
    ckpt = trained[0]
    pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "40",
                         "--greedy"])
    out = capsys.readouterr().out
    assert out.startswith("First") and out.endswith("\n")
    assert len(out) == len("First") + 40 + 1
    # The same text as the Python API, and as re-running the window without the cache.
    model, tok = pygpt.load(ckpt)
    ids = model.generate(torch.tensor([tok.encode("First")]), 40, sampling=Sampling(greedy=True))
    assert out == tok.decode(ids[0].tolist()) + "\n"
    pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "40",
                         "--greedy", "--no-cache", "--kernels", "torch"])
    assert capsys.readouterr().out == out

    # Sampling with a seed reproduces; options reach the sampler.
    sample = ["--ckpt", str(ckpt), "--prompt", "A", "--max-new-tokens", "30", "--seed", "4",
              "--temperature", "0.8", "--top-k", "10", "--top-p", "0.9"]
    pygpt.generate.main(sample)
    first = capsys.readouterr().out
    pygpt.generate.main(sample)
    assert capsys.readouterr().out == first and first.startswith("A")


def test_generate_cli_unknown_characters(trained, capsys):
    with pytest.raises(SystemExit) as info:
        pygpt.generate.main(["--ckpt", str(trained[0]), "--prompt", "Caf\u00e9 \u20ac #\u00e9!"])
    msg = str(info.value.code)
    assert msg.startswith("error: ")
    for c in ("\u00e9", "\u20ac", "#"):
        assert repr(c) in msg, c
    assert "'C'" not in msg and "'a'" not in msg  # known characters are not listed
    assert "3 character(s)" in msg
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("args, pattern", [
    (["--max-new-tokens", "-1"], "max-new-tokens"),
    (["--top-p", "1.5"], "top_p"),
    (["--top-k", "0"], "top_k"),
    (["--temperature", "0"], "temperature"),
    (["--prompt", ""], "prompt"),
])
def test_generate_cli_bad_options(trained, args, pattern, capsys):
    with pytest.raises(SystemExit, match=rf"^error: .*{pattern}"):
        pygpt.generate.main(["--ckpt", str(trained[0])] + args)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("damage", ["no-folder", "truncated", "vocab", "n_embd"])
def test_generate_cli_on_bad_checkpoint_exits_cleanly(ckpt, damage, capsys):
    if damage == "no-folder":
        shutil.rmtree(ckpt)
    elif damage == "truncated":
        w = ckpt / WEIGHTS
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif damage == "vocab":
        edit_json(ckpt / "tokenizer.json", lambda t: t["chars"].pop())
    else:
        edit_json(ckpt / "config.json", lambda c: c["model"].update(n_embd=32))
    with pytest.raises(SystemExit, match=r"^error: "):
        pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "3"])
    assert capsys.readouterr().out == ""  # nothing printed before the error
