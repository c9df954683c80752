"""`python -m pygpt.train`'s run folder, where the user meets it: a new run never goes into a
folder holding other files (unless --overwrite, which checks everything first and deletes only
pygpt's run files), the folder is locked while a run writes into it (a second live run is refused
naming the owner's pid, a stale lock is taken over, only rank 0 locks), an --out that is a file
or cannot be written is refused before training, a half-written metrics line does not block
--resume, a relative --data is recorded absolute, and the run ends with one human line (or
--json). Each command runs in-process through pygpt.train.main; tiny models, a few steps."""

import json
import os
import subprocess
import sys

import pytest

import pygpt.train
import pygpt.training.run_folder as run_folder
from helpers import TINY_FLAGS, metrics, snapshot, train_cli
from pygpt.storage.run_files import CONFIG, METRICS, WEIGHTS
from pygpt.training.run_folder import LOCK, RunFolder

FLAGS = TINY_FLAGS + ["--threads", "1"]


@pytest.fixture
def run(text_file, tmp_path):
    """A finished tiny run in tmp_path/run (5 steps)."""
    out = tmp_path / "run"
    assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)]) == (0, None)
    return out


# --- a new run and the folder's contents ------------------------------------------------------

@pytest.mark.parametrize("held", [["config.json", "tokenizer.json", "metrics.jsonl"],
                                  ["notes.txt"]])
def test_new_run_refuses_a_folder_holding_files(text_file, tmp_path, held):
    out = tmp_path / "out"
    out.mkdir()
    for name in held:
        (out / name).write_text(f"someone's {name}\n")
    before = snapshot(out)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)])
    assert code == 1 and message.startswith("error: ") and "\n" not in message
    assert "not empty" in message and held[0] in message and "--overwrite" in message
    assert snapshot(out) == before  # untouched, and no lock left behind


def test_new_run_into_an_empty_or_absent_folder(text_file, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    absent = tmp_path / "a" / "b"
    for out in (empty, absent):
        assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)]) == (0, None)
        assert (out / WEIGHTS).is_file() and not (out / LOCK).exists()
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"checkpoint of step 5 in {absent}, val loss ")
    assert f"python -m pygpt.generate --ckpt {absent}" in line


def test_a_second_new_run_into_a_checkpoint_is_refused(run, text_file):
    before = snapshot(run)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(run)])
    assert code == 1 and "already holds a checkpoint" in message and "--resume" in message
    assert snapshot(run) == before


@pytest.mark.parametrize("bad", ["flag", "missing-data", "empty-data", "directory-data",
                                 "not-utf8", "too-short"])
def test_overwrite_checks_everything_before_deleting(run, text_file, tmp_path, bad):
    (run / "notes.txt").write_text("mine\n")
    before = snapshot(run)
    data = tmp_path / "data.txt"
    flags = FLAGS + ["--out", str(run), "--overwrite", "--data", str(data)]
    if bad == "flag":
        data = text_file
        flags = flags[:-1] + [str(text_file), "--warmup-iters", "-3"]
    elif bad == "empty-data":
        data.write_bytes(b"")
    elif bad == "directory-data":
        data.mkdir()
    elif bad == "not-utf8":
        data.write_bytes(b"caf\xe9 au lait\n" * 100)
    elif bad == "too-short":
        data.write_text("tiny text\n")
    code, message = train_cli(flags)
    assert code == 1 and message.startswith("error: ")
    assert snapshot(run) == before


def test_overwrite_replaces_only_run_files(run, text_file):
    (run / "notes.txt").write_text("mine\n")
    weights = (run / WEIGHTS).read_bytes()
    assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(run), "--overwrite",
                        "--seed", "9", "--max-iters", "4", "--eval-interval", "4"]) == (0, None)
    assert (run / "notes.txt").read_text() == "mine\n"
    assert (run / WEIGHTS).read_bytes() != weights
    assert [r["step"] for r in metrics(run)] == [4]  # the earlier run's records are gone


def test_leftovers_of_a_killed_save_do_not_count(text_file, tmp_path):
    """A folder holding only what a save killed before its commit left (a staging folder, a
    temporary file) is recovered when locked: empty, so a new run goes there."""
    out = tmp_path / "killed"
    (out / ".staging-4242").mkdir(parents=True)
    (out / ".staging-4242" / WEIGHTS).write_bytes(b"half")
    (out / f".{CONFIG}.tmp-4242").write_text("half")
    assert train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)]) == (0, None)
    assert not [p.name for p in out.iterdir() if ".staging-" in p.name or ".tmp-" in p.name]


# --- --out that cannot hold a run ---------------------------------------------------------------

def refuse_training(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("training started")

    monkeypatch.setattr(pygpt.train, "train", fail)


def test_out_naming_a_file_is_refused_before_training(text_file, tmp_path, monkeypatch):
    out = tmp_path / "file"
    out.write_text("not a folder")
    refuse_training(monkeypatch)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)])
    assert code == 1 and "is a file, not a folder" in message
    assert out.read_text() == "not a folder"
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out / "sub")])
    assert code == 1 and message.startswith("error: ")


def test_out_naming_a_link_to_a_folder_is_refused_before_training(text_file, tmp_path,
                                                                  monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    refuse_training(monkeypatch)
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(tmp_path / "link")])
    assert code == 1 and "symbolic link" in message and "\n" not in message, message
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_unwritable_out_is_refused_before_training(text_file, tmp_path, monkeypatch):
    refuse_training(monkeypatch)
    out = tmp_path / "read-only"
    out.mkdir()
    out.chmod(0o500)
    try:
        if not os.access(out, os.W_OK):  # a user chmod binds (not root)
            code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(out)])
            assert code == 1 and "cannot write into the --out folder" in message
    finally:
        out.chmod(0o700)

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(run_folder, "_open_lock_file", denied)  # as the kernel refuses it
    code, message = train_cli(FLAGS + ["--data", str(text_file), "--out", str(tmp_path / "new")])
    assert code == 1 and "cannot write into the --out folder" in message
    assert "Permission denied" in message
    assert not (tmp_path / "new").exists()  # the folder it created is removed again


# --- the lock -------------------------------------------------------------------------------------

HOLD = ("import sys, time\nfrom pygpt.training.run_folder import RunFolder\n"
        "RunFolder(sys.argv[1]).__enter__()\nprint('locked', flush=True)\ntime.sleep(120)\n")


def test_a_live_run_is_refused_and_a_dead_ones_lock_taken_over(run, capsys):
    before = snapshot(run)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, message = train_cli(["--resume", "--out", str(run), "--max-iters", "7", "--quiet"])
        assert code == 1 and f"pid {holder.pid} on host" in message
        assert "in use by another training run" in message
        assert {n: b for n, b in snapshot(run).items() if n != LOCK} == before
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((run / LOCK).read_text())["pid"] == holder.pid  # left behind: stale
    capsys.readouterr()
    assert train_cli(["--resume", "--out", str(run), "--max-iters", "7", "--quiet"]) == (0, None)
    assert f"left by pid {holder.pid}" in capsys.readouterr().err
    assert json.loads((run / CONFIG).read_text())["step"] == 7
    assert not (run / LOCK).exists()


def test_the_lock_names_this_process_and_only_rank_0_takes_it(run, monkeypatch, capsys):
    with RunFolder(run):
        owner = json.loads((run / LOCK).read_text())
        assert owner["pid"] == os.getpid()
        code, message = train_cli(["--resume", "--out", str(run), "--max-iters", "6", "--quiet"])
        assert code == 1 and f"pid {os.getpid()}" in message
        # Rank 1 of a torchrun job (seen by main alone here: no process group) takes no lock
        # and prints no last line.
        monkeypatch.setenv("RANK", "1")
        capsys.readouterr()
        assert train_cli(["--resume", "--out", str(run), "--max-iters", "6", "--quiet"]) == (0, None)
        assert "next:" not in capsys.readouterr().out
    assert not (run / LOCK).exists()


def test_a_lock_file_json_cannot_read_is_taken_over(tmp_path):
    (tmp_path / LOCK).write_text("[" * 4000)  # nested past Python's json recursion limit
    with RunFolder(tmp_path):
        assert json.loads((tmp_path / LOCK).read_text())["pid"] == os.getpid()


# --- resume, paths and the last line ----------------------------------------------------------------

@pytest.mark.parametrize("line", ['{"step": 9, "train_lo',  # killed mid-append
                                  "[" * 100000, '{"step": ' + "9" * 5000])  # json cannot read
def test_resume_after_a_half_written_metrics_line(run, capsys, line):
    with open(run / METRICS, "a") as f:
        f.write(line)
    assert train_cli(["--resume", "--out", str(run), "--max-iters", "7", "--quiet"]) == (0, None)
    assert [r["step"] for r in metrics(run)] == [5, 7]
    assert "damaged line" in capsys.readouterr().err


def test_relative_data_is_recorded_absolute(text_file, tmp_path, monkeypatch):
    monkeypatch.chdir(text_file.parent)
    out = tmp_path / "rel"
    assert train_cli(FLAGS + ["--data", text_file.name, "--out", str(out)]) == (0, None)
    assert json.loads((out / CONFIG).read_text())["train"]["data"] == str(text_file)
    monkeypatch.chdir(tmp_path)
    assert train_cli(["--resume", "--out", str(out), "--max-iters", "6", "--quiet"]) == (0, None)
    # No --data: the shipped text, recorded as None (wherever the package is installed).
    args = pygpt.train.build_parser().parse_args(["--out", str(tmp_path / "x")])
    assert pygpt.train.configs_from_args(args)[1].data is None


def test_json_ends_with_the_last_metrics(run, capsys):
    capsys.readouterr()
    assert train_cli(["--resume", "--out", str(run), "--max-iters", "6", "--quiet", "--json"]) == (0, None)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == metrics(run)[-1]


def test_last_line_names_the_next_command():
    from pygpt.config import ModelConfig, TrainConfig

    done = {"step": 8, "val_loss": 1.23456}
    cases = [(ModelConfig(), TrainConfig(out="a b"), "python -m pygpt.generate --ckpt 'a b'"),
             (ModelConfig(arch="bert"), TrainConfig(), "python -m pygpt.fill_mask --ckpt out"),
             (ModelConfig(arch="bert"), TrainConfig(task="classify"), "pygpt.classify --ckpt out"),
             (ModelConfig(arch="bert", num_labels=3), TrainConfig(), "pygpt.classify --ckpt")]
    for model_cfg, train_cfg, command in cases:
        line = pygpt.train.next_step(model_cfg, train_cfg, done)
        assert "step 8" in line and "val loss 1.2346" in line and command in line, line
    assert "nothing to train" in pygpt.train.next_step(ModelConfig(), TrainConfig(), {"step": 8})
