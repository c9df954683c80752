"""The training loop (pygpt.training): a resumed run equals a straight one (also after Ctrl-C),
metrics and checkpoints are written every evaluation, runs reproduce, the seed preset trains,
and bad data is a clear error (through the CLI too). Checkpoint files are tested in
test_checkpoint.py and the command lines in test_cli.py. Tiny models and a few steps each, so the
module runs in well under a minute on one core."""

import dataclasses
import json
import math
import signal

import pytest
import torch

import pygpt
import pygpt.train
from helpers import TINY_FLAGS, TINY_MODEL, metrics, state_dicts_equal, tiny_train_cfg
from pygpt.data.text import TokenSplits, read_text
from pygpt.storage.run_files import CONFIG, METRICS, TRAIN_STATE, WEIGHTS
from pygpt.training import train


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
    opt_s = torch.load(straight / TRAIN_STATE, weights_only=True)["optimizer"]["state"]
    opt_r = torch.load(resumed / TRAIN_STATE, weights_only=True)["optimizer"]["state"]
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
    assert json.loads((stopped / CONFIG).read_text())["step"] == 3
    train(model_cfg, tiny_train_cfg(text_file, stopped, **common), resume=True, progress=False)
    state_dicts_equal(pygpt.load(straight)[0].state_dict(), pygpt.load(stopped)[0].state_dict())
    # The SIGINT handler was restored.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_resume_at_or_past_max_iters_does_nothing(text_file, tmp_path):
    out = tmp_path / "run"
    train(TINY_MODEL, tiny_train_cfg(text_file, out), progress=False)
    before = (out / WEIGHTS).read_bytes()
    result = train(TINY_MODEL, tiny_train_cfg(text_file, out), resume=True, progress=False)
    assert result["step"] == 6
    assert (out / WEIGHTS).read_bytes() == before


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


# --- (b) metrics and reproducibility ----------------------------------------------------------

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
    from pygpt.config.presets import preset

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
    assert not (tmp_path / "out" / WEIGHTS).exists()
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



# --- (d) the warmup of a short run --------------------------------------------------------------

def test_a_warmup_over_a_third_of_the_schedule_is_warned_about(text_file, tmp_path, capsys):
    """The default 100 warmup steps in a 100-step run are the whole run: a warning says so (the
    schedule itself is kept, so a resumed run still equals a straight one); a 300-step run with
    the same warmup gets none."""
    from pygpt.config import TrainConfig
    from pygpt.training.optim import lr_at, warmup_warning

    short = TrainConfig(max_iters=100, warmup_iters=100, lr=1e-3)
    assert "100% of the 100-step schedule: the whole run is warmup" in warmup_warning(short)
    assert lr_at(99, short) == 1e-3 and lr_at(98, short) < 1e-3
    assert "50% of the 200-step" in warmup_warning(TrainConfig(max_iters=200))
    assert "whole run" not in warmup_warning(TrainConfig(max_iters=200))
    assert warmup_warning(TrainConfig(max_iters=300)) is None
    assert warmup_warning(TrainConfig(max_iters=10, lr_decay_iters=300)) is None
    assert warmup_warning(TrainConfig(max_iters=10, warmup_iters=0)) is None
    train(TINY_MODEL, tiny_train_cfg(text_file, tmp_path / "w", max_iters=3, warmup_iters=5),
          progress=False)
    assert "--warmup-iters 5 is 167% of the 3-step schedule" in capsys.readouterr().err
