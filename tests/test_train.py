"""Training runs, checkpoints and the command lines: exact resume, checkpoint round trips,
clear errors for bad data and damaged checkpoints, the two CLIs, and atomic saves. Tiny models
and a few steps each, so the module runs in well under a minute on one core."""

import dataclasses
import json
import math
import shutil
import signal
from pathlib import Path

import pytest
import torch

import pygpt
import pygpt.generate
import pygpt.train
from pygpt import checkpoint
from pygpt.config import ModelConfig, TrainConfig
from pygpt.data import SHIPPED_TEXT, TokenSplits, read_text
from pygpt.io import atomic_write
from pygpt.model import GPT
from pygpt.tokenizer import CharTokenizer, load_tokenizer
from pygpt.train import METRICS, train

TINY_MODEL = ModelConfig(block_size=8, n_layer=1, n_head=2, n_embd=16)
# The CLI flags of the same tiny run.
TINY_FLAGS = ["--n-layer", "1", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
              "--max-iters", "5", "--eval-interval", "5", "--eval-iters", "2",
              "--batch-size", "4", "--quiet"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """The first 3000 characters of the shipped Shakespeare (52 distinct characters)."""
    path = tmp_path_factory.mktemp("data") / "shakespeare.txt"
    path.write_text(SHIPPED_TEXT.read_text(encoding="utf-8")[:3000], encoding="utf-8")
    return path


def tiny_train_cfg(text_file, out, **overrides):
    base = dict(data=str(text_file), out=str(out), batch_size=4, max_iters=6, eval_interval=3,
                eval_iters=2, warmup_iters=2, lr=3e-3, min_lr=3e-4, seed=5)
    return TrainConfig(**{**base, **overrides})


def state_dicts_equal(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} differs, max abs diff " \
                                              f"{(a[name] - b[name]).abs().max().item():.3e}"


def metrics(out):
    return [json.loads(line) for line in (Path(out) / METRICS).read_text().splitlines()]


def losses_by_step(out):
    return {r["step"]: (r["train_loss"], r["val_loss"]) for r in metrics(out)}


# --- (a) resume equals straight ---------------------------------------------------------------

@pytest.mark.parametrize("kernels", ["ext", "torch"])
def test_resume_equals_straight(text_file, tmp_path, kernels):
    """6 steps, then resumed to 10, equals 10 straight: weights bit for bit, and the same eval
    losses. Dropout > 0 and grad accumulation, so the dropout RNG and data order must both come
    back exactly; the cosine schedule ends at a fixed lr_decay_iters so both runs share it."""
    model_cfg = dataclasses.replace(TINY_MODEL, dropout=0.2)
    common = dict(lr_decay_iters=10, grad_accum=2, eval_interval=3, kernels=kernels)
    straight = tmp_path / "straight"
    train(model_cfg, tiny_train_cfg(text_file, straight, max_iters=10, **common), progress=False)
    resumed = tmp_path / "resumed"
    first = train(model_cfg, tiny_train_cfg(text_file, resumed, max_iters=6, **common),
                  progress=False)
    assert first["step"] == 6
    last = train(model_cfg, tiny_train_cfg(text_file, resumed, max_iters=10, **common),
                 resume=True, progress=False)
    assert last["step"] == 10

    model_s, _ = pygpt.load(straight)
    model_r, _ = pygpt.load(resumed)
    state_dicts_equal(model_s.state_dict(), model_r.state_dict())
    # Evaluations at 3, 6, 9 and the final step 10, the same in both runs.
    assert [r["step"] for r in metrics(resumed)] == [3, 6, 9, 10]
    assert losses_by_step(resumed) == losses_by_step(straight)
    # The optimizer state matches too (Adam moments and step counts).
    opt_s = torch.load(straight / checkpoint.STATE, weights_only=True)["optimizer"]["state"]
    opt_r = torch.load(resumed / checkpoint.STATE, weights_only=True)["optimizer"]["state"]
    for i in opt_s:
        for key in opt_s[i]:
            assert torch.equal(opt_s[i][key], opt_r[i][key]), (i, key)


def test_resume_after_ctrl_c_equals_straight(text_file, tmp_path, monkeypatch, capsys):
    """A Ctrl-C during step 4 finishes that step, saves, and stops; resuming from there equals
    the straight run."""
    model_cfg = dataclasses.replace(TINY_MODEL, dropout=0.2)
    common = dict(lr_decay_iters=8, max_iters=8, eval_interval=4)
    straight = tmp_path / "straight"
    train(model_cfg, tiny_train_cfg(text_file, straight, **common), progress=False)

    calls = {"n": 0}
    real_batch = TokenSplits.batch

    def batch_with_interrupt(self, split, batch_size, generator=None):
        if split == "train" and generator is not None:
            calls["n"] += 1
            if calls["n"] == 3:  # inside step 3 (0-based 2): request a stop, as Ctrl-C does
                signal.raise_signal(signal.SIGINT)
        return real_batch(self, split, batch_size, generator)

    stopped = tmp_path / "stopped"
    monkeypatch.setattr(TokenSplits, "batch", batch_with_interrupt)
    result = train(model_cfg, tiny_train_cfg(text_file, stopped, **common), progress=False)
    monkeypatch.undo()
    assert result["step"] == 3
    assert "--resume" in capsys.readouterr().err
    assert json.loads((stopped / checkpoint.CONFIG).read_text())["step"] == 3
    train(model_cfg, tiny_train_cfg(text_file, stopped, **common), resume=True, progress=False)
    state_dicts_equal(pygpt.load(straight)[0].state_dict(), pygpt.load(stopped)[0].state_dict())
    # The SIGINT handler was restored.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_at_or_past_max_iters_does_nothing(text_file, tmp_path):
    out = tmp_path / "run"
    train(TINY_MODEL, tiny_train_cfg(text_file, out), progress=False)
    before = (out / checkpoint.WEIGHTS).read_bytes()
    result = train(TINY_MODEL, tiny_train_cfg(text_file, out), resume=True, progress=False)
    assert result["step"] == 6
    assert (out / checkpoint.WEIGHTS).read_bytes() == before


def test_resume_drops_metrics_past_the_checkpoint(text_file, tmp_path):
    """Records after the checkpoint's step (from a run killed after it) are dropped on resume,
    so metrics.jsonl stays one record per evaluation of the continued run."""
    out = tmp_path / "run"
    cfg = tiny_train_cfg(text_file, out, max_iters=6, lr_decay_iters=9)
    train(TINY_MODEL, cfg, progress=False)
    with open(out / METRICS, "a") as f:
        f.write(json.dumps({"step": 7, "train_loss": 0.0, "val_loss": 0.0}) + "\n\n")
    train(TINY_MODEL, dataclasses.replace(cfg, max_iters=9), resume=True, progress=False)
    assert [r["step"] for r in metrics(out)] == [3, 6, 9]
    assert all(r["val_loss"] > 0 for r in metrics(out))


# --- (b) checkpoint round trip and metrics ----------------------------------------------------

@pytest.mark.parametrize("arch", ["default", "sinusoidal-untied", "seed"])
def test_checkpoint_round_trip(tmp_path, arch):
    from pygpt.config import preset

    tokenizer = CharTokenizer.from_text("hello, world!\nHELLO?")
    cfg = dict(default=TINY_MODEL,
               **{"sinusoidal-untied": dataclasses.replace(TINY_MODEL, pos_encoding="sinusoidal",
                                                           tie_weights=False, head_bias=True)},
               seed=preset("seed").model)[arch]
    cfg = dataclasses.replace(cfg, vocab_size=tokenizer.vocab_size)
    torch.manual_seed(3)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    out = tmp_path / "ckpt"
    checkpoint.save(out, model, tokenizer, TrainConfig(out=str(out)), state={"x": 1}, step=42)
    for name in ("config.json", "tokenizer.json", "model.safetensors", "train_state.pt"):
        assert (out / name).is_file(), name
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]

    for kernels in ("ext", "torch"):
        loaded, tok = pygpt.load(out, kernels=kernels)
        assert not loaded.training and loaded.kernels == kernels
        assert loaded.config == cfg
        assert tok.chars == tokenizer.chars
        state_dicts_equal(model.state_dict(), loaded.state_dict())
        if cfg.tie_weights:
            assert loaded.lm_head.weight is loaded.tok_emb.weight  # still tied after loading
        x = torch.tensor([tok.encode("hello, wor")[:cfg.block_size]])
        model.kernels = kernels
        assert torch.equal(loaded(x).logits, model(x).logits)

    config = json.loads((out / "config.json").read_text())
    assert config["step"] == 42 and config["format"] == checkpoint.FORMAT
    assert config["model"] == dataclasses.asdict(cfg)
    assert config["train"]["out"] == str(out)
    assert checkpoint.weights_step(out) == 42
    assert checkpoint.load_train_state(out) == {"x": 1, "step": 42}


def test_training_writes_checkpoint_and_metrics(text_file, tmp_path):
    out = tmp_path / "run"
    result = train(TINY_MODEL, tiny_train_cfg(text_file, out, max_iters=7, eval_interval=3),
                   progress=False)
    for name in ("config.json", "tokenizer.json", "model.safetensors", "train_state.pt"):
        assert (out / name).is_file(), name
    records = metrics(out)
    assert [r["step"] for r in records] == [3, 6, 7]  # every eval_interval, and the last step
    for r in records:
        for key in ("train_loss", "val_loss", "val_ppl", "train_ppl", "lr", "tokens",
                    "tokens_per_s"):
            assert isinstance(r[key], float) or isinstance(r[key], int), key
            assert math.isfinite(r[key]), key
        assert r["val_ppl"] == pytest.approx(math.exp(r["val_loss"]))
        assert r["tokens"] == r["step"] * 4 * 8
    assert records[-1] == result
    # The tokenizer is the text's characters, and the loaded model reproduces the eval loss.
    model, tok = pygpt.load(out)
    assert tok.chars == sorted(set(text_file.read_text()))
    assert model.config.vocab_size == tok.vocab_size == 52
    splits = TokenSplits(torch.tensor(tok.encode(text_file.read_text())), 8)
    gen = torch.Generator().manual_seed(5 + 2)  # evaluate()'s generator for the val split
    with torch.no_grad():
        val = sum(model(*splits.batch("val", 4, gen)).loss.item() for _ in range(2)) / 2
    assert val == pytest.approx(result["val_loss"], abs=1e-6)


def test_training_is_reproducible(text_file, tmp_path):
    a = train(TINY_MODEL, tiny_train_cfg(text_file, tmp_path / "a"), progress=False)
    b = train(TINY_MODEL, tiny_train_cfg(text_file, tmp_path / "b"), progress=False)
    assert (a["train_loss"], a["val_loss"]) == (b["train_loss"], b["val_loss"])
    state_dicts_equal(pygpt.load(tmp_path / "a")[0].state_dict(),
                      pygpt.load(tmp_path / "b")[0].state_dict())


def test_sgd_seed_preset_trains(text_file, tmp_path):
    from pygpt.config import preset

    p = preset("seed")
    cfg = dataclasses.replace(p.train, data=str(text_file), out=str(tmp_path / "seed"),
                              max_iters=4, eval_interval=4, eval_iters=1, batch_size=4)
    result = train(p.model, cfg, progress=False)
    assert result["step"] == 4 and math.isfinite(result["val_loss"])
    model, _ = pygpt.load(tmp_path / "seed")
    assert model.config.n_embd == 60 and model.config.vocab_size == 52


# --- (c) bad data -----------------------------------------------------------------------------

def test_bad_data_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"(?i)empty"):
        read_text(empty)

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"(?i)not UTF-8.*0xe9.*offset 3"):
        read_text(latin1)

    with pytest.raises(FileNotFoundError, match="no data file"):
        read_text(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="directory"):
        read_text(tmp_path)

    assert read_text(None).startswith("First Citizen")  # the shipped text


@pytest.mark.parametrize("content, error, pattern", [
    (b"", ValueError, r"empty"),
    (b"\xff\xfe\x00abc", ValueError, r"UTF-8"),
    (b"tiny text\n", ValueError, r"too short.*block.size"),
    (b"x" * 40, ValueError, r"too short.*val split"),  # train fits, val (4 tokens) does not
    (None, FileNotFoundError, r"no data file"),
])
def test_bad_data_through_train(tmp_path, content, error, pattern):
    data = tmp_path / "data.txt"
    if content is not None:
        data.write_bytes(content)
    cfg = tiny_train_cfg(data, tmp_path / "out")
    with pytest.raises(error, match="(?i)" + pattern):
        train(TINY_MODEL, cfg, progress=False)
    assert not (tmp_path / "out" / checkpoint.WEIGHTS).exists()
    # The CLI turns the same error into a one-line exit message.
    with pytest.raises(SystemExit, match=r"(?i)^error: .*" + pattern):
        pygpt.train.main(TINY_FLAGS + ["--data", str(data), "--out", str(tmp_path / "cli")])


def test_text_shorter_than_context_message():
    with pytest.raises(ValueError) as info:
        TokenSplits(torch.arange(20), block_size=8)
    msg = str(info.value)
    assert "too short" in msg and "val" in msg and "9" in msg and "--block-size" in msg
    TokenSplits(torch.arange(100), block_size=8)  # val has 10 > 8 tokens: fine
    # The boundary: a split of exactly block_size tokens has no (x, y) window; one more has one.
    with pytest.raises(ValueError, match="val split has 8 tokens"):
        TokenSplits(torch.arange(80), block_size=8)
    splits = TokenSplits(torch.arange(90), block_size=8)  # train 81, val 9
    x, y = splits.batch("val", 3, torch.Generator().manual_seed(0))
    assert torch.equal(x[0], torch.arange(81, 89)) and torch.equal(y[0], torch.arange(82, 90))


def test_batches_are_next_token_windows():
    splits = TokenSplits(torch.arange(200), block_size=8)
    x, y = splits.batch("train", 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (16, 8)
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)
    assert int(y.max()) < 180  # train split only
    xv, _ = splits.batch("val", 4, torch.Generator().manual_seed(0))
    assert int(xv.min()) >= 180


# --- (d) bad checkpoints ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(text_file, tmp_path_factory):
    """A finished tiny run (steps 3 and 6 checkpointed), plus the step-3 train_state kept aside;
    tests copy the folder before damaging it."""
    out = tmp_path_factory.mktemp("trained") / "run"
    cfg = tiny_train_cfg(text_file, out, max_iters=3)
    train(TINY_MODEL, cfg, progress=False)
    step3_state = (out / checkpoint.STATE).read_bytes()
    train(TINY_MODEL, dataclasses.replace(cfg, max_iters=6), resume=True, progress=False)
    return out, step3_state


@pytest.fixture
def ckpt(trained, tmp_path):
    dst = tmp_path / "ckpt"
    shutil.copytree(trained[0], dst)
    return dst


def edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_missing_checkpoint_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        pygpt.load(tmp_path / "nowhere")


def test_folder_without_config(tmp_path, ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="not a checkpoint.*config.json"):
        pygpt.load(ckpt)
    with pytest.raises(FileNotFoundError, match="not a checkpoint"):
        pygpt.load(tmp_path)  # some other folder


@pytest.mark.parametrize("content, pattern", [
    ("{not json", "corrupt"),
    ('{"format": 99, "model": {}}', "not a pygpt checkpoint"),
    ("[1, 2]", "not a pygpt checkpoint"),
    ('{"format": 1, "model": {"n_embd": 16, "colour": "red"}}', "unknown ModelConfig keys"),
    ('{"format": 1, "model": {"n_embd": 15, "n_head": 2}}', "divisible"),
    ('{"format": 1, "model": null}', "invalid model config"),
])
def test_corrupt_config(ckpt, content, pattern):
    (ckpt / "config.json").write_text(content)
    with pytest.raises(ValueError, match=pattern):
        pygpt.load(ckpt)


@pytest.mark.parametrize("fraction", [0.5, 0.01, 0.0])
def test_truncated_weights(ckpt, fraction):
    weights = ckpt / checkpoint.WEIGHTS
    data = weights.read_bytes()
    weights.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ValueError, match="truncated, corrupt"):
        pygpt.load(ckpt)


def test_garbage_weights(ckpt):
    (ckpt / checkpoint.WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not a header")
    with pytest.raises(ValueError, match=checkpoint.WEIGHTS):
        pygpt.load(ckpt)


def test_missing_weights(ckpt):
    (ckpt / checkpoint.WEIGHTS).unlink()
    with pytest.raises(FileNotFoundError, match="no weights file"):
        pygpt.load(ckpt)


@pytest.mark.parametrize("edit, pattern", [
    (dict(n_embd=32), "does not match config.json: n_embd is 32 there but 16"),
    (dict(n_layer=2), "does not match config.json: n_layer is 2 there but 1"),
    (dict(block_size=16), "does not match config.json: block_size is 16 there"),
    (dict(pos_encoding="sinusoidal"), "does not match config.json: pos_encoding is 'sinusoidal'"),
    (dict(tie_weights=False), "does not match config.json: tie_weights is False"),
    (dict(mlp=False), "does not match config.json: mlp is False there but True"),
])
def test_config_weights_mismatch(ckpt, edit, pattern):
    edit_json(ckpt / "config.json", lambda c: c["model"].update(edit))
    with pytest.raises(ValueError, match=pattern):
        pygpt.load(ckpt)


def test_config_with_float_width(ckpt):
    edit_json(ckpt / "config.json", lambda c: c["model"].update(n_embd=16.0))
    with pytest.raises(ValueError, match="n_embd"):
        pygpt.load(ckpt)


def test_tokenizer_model_vocab_mismatch(ckpt):
    edit_json(ckpt / "tokenizer.json", lambda t: t["chars"].pop())
    with pytest.raises(ValueError, match="tokenizer has 51 tokens.*configured for 52"):
        pygpt.load(ckpt)


@pytest.mark.parametrize("content, error, pattern", [
    (None, FileNotFoundError, "no tokenizer"),
    ("{oops", ValueError, "not a valid tokenizer"),
    ('{"kind": "bpe", "merges": []}', ValueError, "unsupported tokenizer"),
    ('{"kind": "char", "chars": ["a", "a"]}', ValueError, "distinct"),
])
def test_bad_tokenizer_file(ckpt, content, error, pattern):
    path = ckpt / "tokenizer.json"
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(error, match=pattern):
        pygpt.load(ckpt)
    if content is not None:
        with pytest.raises(error, match=pattern):
            load_tokenizer(path)


def test_train_state_from_another_step(ckpt, trained, text_file):
    """A kill between writing the weights (step 6) and the training state leaves the state of
    step 3 beside weights of step 6: detected, never resumed."""
    (ckpt / checkpoint.STATE).write_bytes(trained[1])
    with pytest.raises(ValueError, match=r"step 3 but the weights from step 6.*interrupted"):
        checkpoint.load_train_state(ckpt)
    cfg = tiny_train_cfg(text_file, ckpt, max_iters=9)
    with pytest.raises(ValueError, match="interrupted"):
        train(TINY_MODEL, cfg, resume=True, progress=False)
    with pytest.raises(SystemExit, match="error: .*interrupted"):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])
    pygpt.load(ckpt)  # the weights themselves are still usable for generation


def test_bad_train_state(ckpt):
    state = ckpt / checkpoint.STATE
    state.write_bytes(state.read_bytes()[:100])
    with pytest.raises(ValueError, match="truncated or corrupt"):
        checkpoint.load_train_state(ckpt)
    state.unlink()
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        checkpoint.load_train_state(ckpt)
    with pytest.raises(SystemExit, match="error: .*nothing to resume"):
        pygpt.train.main(["--resume", "--out", str(ckpt), "--max-iters", "9", "--quiet"])


@pytest.mark.parametrize("damage", ["no-folder", "truncated", "vocab", "n_embd"])
def test_generate_cli_on_bad_checkpoint_exits_cleanly(ckpt, damage, capsys):
    if damage == "no-folder":
        shutil.rmtree(ckpt)
    elif damage == "truncated":
        w = ckpt / checkpoint.WEIGHTS
        w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    elif damage == "vocab":
        edit_json(ckpt / "tokenizer.json", lambda t: t["chars"].pop())
    else:
        edit_json(ckpt / "config.json", lambda c: c["model"].update(n_embd=32))
    with pytest.raises(SystemExit, match=r"^error: "):
        pygpt.generate.main(["--ckpt", str(ckpt), "--prompt", "First", "--max-new-tokens", "3"])
    assert capsys.readouterr().out == ""  # nothing printed before the error


# --- (e) the command lines --------------------------------------------------------------------

def run_train_cli(args, capsys):
    pygpt.train.main(args)
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
    weights = (out / checkpoint.WEIGHTS).read_bytes()

    # A second run into the same folder is refused and leaves it alone.
    with pytest.raises(SystemExit, match="already holds a checkpoint.*--resume.*--overwrite"):
        pygpt.train.main(args)
    assert (out / checkpoint.WEIGHTS).read_bytes() == weights

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
    assert (out / checkpoint.WEIGHTS).read_bytes() != weights


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
    from pygpt.sampling import Sampling

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


# --- (f) atomic writes ------------------------------------------------------------------------

def test_crash_while_saving_weights_keeps_previous(ckpt, monkeypatch):
    """A save that dies half-way through writing the weights leaves the previous
    model.safetensors byte for byte, and no temporary file."""
    from safetensors.torch import save_model as real_save_model

    weights = ckpt / checkpoint.WEIGHTS
    before = weights.read_bytes()
    model, tok = pygpt.load(ckpt)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    seen = []

    def dying_save_model(model, filename, *args, **kwargs):
        real_save_model(model, filename, *args, **kwargs)
        data = Path(filename).read_bytes()
        Path(filename).write_bytes(data[: len(data) // 2])  # half the file is on disk...
        seen.append(filename)
        raise OSError("No space left on device")  # ... when the write fails

    monkeypatch.setattr(checkpoint, "save_model", dying_save_model)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save(ckpt, model, tok, step=99)
    assert seen and Path(seen[0]).parent == ckpt and Path(seen[0]).name != checkpoint.WEIGHTS
    assert weights.read_bytes() == before
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        ["config.json", "tokenizer.json", "model.safetensors", "train_state.pt", METRICS,
         "loss.png"])
    monkeypatch.undo()
    loaded, _ = pygpt.load(ckpt)  # the previous weights still load (same architecture)
    assert checkpoint.weights_step(ckpt) == 6


def test_crash_while_saving_train_state_keeps_previous(ckpt, monkeypatch):
    state = ckpt / checkpoint.STATE
    before = state.read_bytes()
    model, tok = pygpt.load(ckpt)
    real_torch_save = torch.save

    def dying_torch_save(obj, f, *args, **kwargs):
        real_torch_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(Path(f).read_bytes()[:50])
        raise KeyboardInterrupt  # killed mid-write

    monkeypatch.setattr(torch, "save", dying_torch_save)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save(ckpt, model, tok, state={"optimizer": {}}, step=7)
    monkeypatch.undo()
    assert state.read_bytes() == before
    assert not [p.name for p in ckpt.iterdir() if ".tmp" in p.name]
    # The weights (step 7) were written but the state was not: the mismatch is detected.
    with pytest.raises(ValueError, match="interrupted"):
        checkpoint.load_train_state(ckpt)


def test_atomic_write_replaces_whole_or_nothing(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old contents")

    def partial(tmp):
        tmp.write_bytes(b"new con")
        raise RuntimeError("crash")

    with pytest.raises(RuntimeError, match="crash"):
        atomic_write(target, partial)
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]
    atomic_write(target, lambda tmp: tmp.write_bytes(b"new contents"))
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["file.bin"]
