"""`python -m pygpt.train --overwrite`: it replaces only an earlier pygpt run (a folder whose
config.json is a pygpt checkpoint config), and only at the new run's first save. A folder of
anything else (an ONNX export, a Hugging Face model, a stranger's config.json) is refused by name
with every file left as it was, and a new run that fails before its first save (a model setting
that breaks at the first step, a diverging rate) leaves the old run whole and loadable. Each
command runs in-process through pygpt.train.main; tiny models, a few steps."""

import json
import signal

import pytest
import torch

import pygpt
import pygpt.export
import pygpt.train
from helpers import TINY_FLAGS, metrics, snapshot, train_cli
from pygpt.storage.run_files import CONFIG, METRICS, RUNNER_CONFIG, TOKENIZER, WEIGHTS

FLAGS = TINY_FLAGS + ["--threads", "1"]


def weights(folder):
    model, _ = pygpt.load(folder)
    return {name: t.clone() for name, t in model.state_dict().items()}


@pytest.fixture
def run(text_file, tmp_path):
    """A finished tiny run in tmp_path/run (5 steps), with a file of the user's beside it."""
    out = tmp_path / "run"
    assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)]) == (0, None)
    (out / "notes.txt").write_text("mine\n")
    return out


# --- folders that hold no pygpt run -------------------------------------------------------------

def export_folder(folder):
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"onnx graph")
    (folder / TOKENIZER).write_text('{"kind": "char", "of": "the export"}')
    (folder / RUNNER_CONFIG).write_text(json.dumps({"format": 1, "family": "gpt"}))


def hf_folder(folder):
    folder.mkdir()
    (folder / CONFIG).write_text(json.dumps({"model_type": "gpt2", "n_layer": 12}))
    (folder / TOKENIZER).write_text('{"version": "1.0", "model": {"type": "BPE"}}')
    (folder / WEIGHTS).write_bytes(b"hf weights")


def strangers_config(folder):
    folder.mkdir()
    (folder / CONFIG).write_text("not json at all")
    (folder / METRICS).write_text("someone's metrics\n")


@pytest.mark.parametrize("make, named", [
    (export_folder, ["ONNX export", RUNNER_CONFIG]),
    (hf_folder, ["not a pygpt run", CONFIG, TOKENIZER, WEIGHTS]),
    (strangers_config, ["not a pygpt run", CONFIG, METRICS]),
])
def test_overwrite_refuses_a_folder_that_holds_no_pygpt_run(text_file, tmp_path, make, named):
    out = tmp_path / "theirs"
    make(out)
    before = snapshot(out)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out), "--overwrite"])
    assert code == 1 and message.startswith(f"error: --out {out} holds ") and "\n" not in message
    assert all(name in message for name in named), message
    assert "choose another" in message
    assert snapshot(out) == before  # every file untouched, and no lock left behind


def test_without_overwrite_a_foreign_folder_is_not_offered_overwrite_as_the_way(text_file,
                                                                                  tmp_path):
    """A folder of someone else's model is not called a checkpoint to resume or overwrite."""
    out = tmp_path / "theirs"
    hf_folder(out)
    before = snapshot(out)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)])
    assert code == 1 and "already holds a checkpoint" not in message and "--resume" not in message
    assert "not empty" in message and CONFIG in message
    assert snapshot(out) == before


# --- a new run that fails before its first save ---------------------------------------------------

@pytest.mark.parametrize("flags", [
    ["--lr", "1e30", "--eval-interval", "1", "--max-iters", "3"],  # diverges at its first steps
    ["--arch", "bert", "--type-vocab-size", "0"],  # breaks at the first forward pass
])
def test_a_new_run_that_fails_before_saving_leaves_the_old_run_whole(run, text_file, flags):
    before, old = snapshot(run), weights(run)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(run), "--overwrite",
                                 *flags])
    assert code == 1 and message.startswith("error: ") and "\n" not in message
    assert snapshot(run) == before
    assert all(torch.equal(t, old[name]) for name, t in weights(run).items())
    # ... and it can still be continued where it stopped.
    assert train_cli(["--resume", "--out", str(run), "--max-iters", "6", "--quiet"]) == (0, None)
    assert [r["step"] for r in metrics(run)] == [5, 6]


def test_a_run_stopped_before_its_first_save_leaves_the_old_run_whole(run, text_file,
                                                                       monkeypatch, capsys):
    """A stop before the first step (Ctrl-C as training begins) saves nothing and draws no
    picture: the folder still holds the old run alone."""
    class StoppedAtOnce(pygpt.train.StopRequest):
        def __init__(self):
            super().__init__()
            self.signum = signal.SIGINT

    monkeypatch.setattr(pygpt.train, "StopRequest", StoppedAtOnce)
    before = snapshot(run)
    code, _ = train_cli(FLAGS + ["--data", str(text_file), "--out", str(run), "--overwrite"])
    assert code == 128 + signal.SIGINT
    assert snapshot(run) == before
    err = capsys.readouterr().err
    assert "stopped at step 0; nothing was saved" in err and "--resume" not in err


# --- a new run that saves ---------------------------------------------------------------------------

def test_the_first_save_replaces_the_old_run_and_keeps_other_files(run, text_file):
    old = weights(run)
    assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(run), "--overwrite", "--seed", "9",
                        "--max-iters", "4", "--eval-interval", "2"]) == (0, None)
    assert (run / "notes.txt").read_text() == "mine\n"
    assert [r["step"] for r in metrics(run)] == [2, 4]  # the old run's records are gone
    assert json.loads((run / CONFIG).read_text())["step"] == 4
    assert not all(torch.equal(t, old[name]) for name, t in weights(run).items())


def test_overwrite_into_an_empty_or_absent_folder(text_file, tmp_path):
    for out in (tmp_path / "empty", tmp_path / "absent"):
        if out.name == "empty":
            out.mkdir()
        assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(out), "--overwrite"]) == (0,
                                                                                            None)
        assert (out / WEIGHTS).is_file()


# --- export --out over a folder ----------------------------------------------------------------

@pytest.mark.parametrize("runner", ['{"name": "my own runner"}', "not json", "[1, 2]"])
def test_export_goes_over_no_runner_json_but_a_pygpt_exports(tmp_path, runner):
    """An export replaces an earlier export's files (tokenizer.json among them), so a folder is
    taken for one only if its runner.json is a pygpt export's, as the runner reads it."""
    out = tmp_path / "theirs"
    out.mkdir()
    (out / RUNNER_CONFIG).write_text(runner)
    (out / TOKENIZER).write_text('{"their": "tokenizer"}')
    before = snapshot(out)
    with pytest.raises(SystemExit) as info:
        pygpt.export.main(["--ckpt", str(tmp_path / "ckpt"), "--out", str(out)])
    message = info.value.code
    assert message.startswith(f"error: --out {out} holds a {RUNNER_CONFIG} ") and "\n" not in message
    assert "not a pygpt export" in message
    assert snapshot(out) == before
