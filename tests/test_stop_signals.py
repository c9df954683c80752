"""Stopping `python -m pygpt.train` by signal: the first Ctrl-C (SIGINT) or SIGTERM finishes the
step, saves, prints the --resume line and exits with 130 or 143 (128 + the signal, as a shell
reports it); a second Ctrl-C interrupts at once (exit 130, no save); the handlers are restored
afterwards. In-process through pygpt.train.main (the signal raised inside a step), and once for
real: SIGTERM sent to a training subprocess, as a job scheduler does."""

import json
import signal
import subprocess
import sys
import time

import pytest

import pygpt.train
from helpers import TINY_FLAGS, metrics
from pygpt.data.text import TokenSplits
from pygpt.storage.run_files import CONFIG, METRICS, WEIGHTS
from pygpt.training.run_folder import LOCK

FLAGS = TINY_FLAGS[:TINY_FLAGS.index("--max-iters")] + [
    "--max-iters", "8", "--eval-interval", "4", "--eval-iters", "2", "--batch-size", "4",
    "--quiet", "--threads", "1"]


def signal_in_step(monkeypatch, signals, at_call=3):
    """Raises `signals` (in order) inside the at_call-th training batch, as a user or a
    scheduler would while that step runs."""
    calls = {"n": 0}
    real = TokenSplits.batch

    def batch(self, split, batch_size, generator=None):
        if split == "train" and generator is not None:
            calls["n"] += 1
            if calls["n"] == at_call:
                for s in signals:
                    signal.raise_signal(s)
        return real(self, split, batch_size, generator)

    monkeypatch.setattr(TokenSplits, "batch", batch)


@pytest.mark.parametrize("signum, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_first_signal_saves_and_exits_128_plus_signal(text_file, tmp_path, monkeypatch, capsys,
                                                      signum, status):
    out = tmp_path / "run"
    signal_in_step(monkeypatch, [signum])
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(FLAGS + ["--data", str(text_file), "--out", str(out)])
    assert info.value.code == status
    captured = capsys.readouterr()
    assert f"stopped at step 3; continue with --resume --out {out}" in captured.err
    assert captured.out.strip().splitlines()[-1].startswith(f"checkpoint of step 3 in {out}")
    assert json.loads((out / CONFIG).read_text())["step"] == 3
    assert not (out / LOCK).exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.undo()
    pygpt.train.main(["--resume", "--out", str(out), "--quiet"])
    assert [r["step"] for r in metrics(out)] == [3, 4, 8]


def test_second_ctrl_c_interrupts_without_saving(text_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    # Calls 1-4: steps 1-4; 5-6: the train split of step 4's evaluation; 7: step 5.
    signal_in_step(monkeypatch, [signal.SIGINT, signal.SIGINT], at_call=7)
    with pytest.raises(SystemExit) as info:
        pygpt.train.main(FLAGS + ["--data", str(text_file), "--out", str(out)])
    assert info.value.code == 130
    assert "interrupted" in capsys.readouterr().err
    assert json.loads((out / CONFIG).read_text())["step"] == 4  # the last save, before step 5
    assert not (out / LOCK).exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_to_a_training_process(text_file, tmp_path):
    out = tmp_path / "run"
    flags = FLAGS[:FLAGS.index("--max-iters")] + [
        "--max-iters", "100000", "--eval-interval", "5", "--eval-iters", "1", "--batch-size", "4",
        "--quiet", "--threads", "1", "--data", str(text_file), "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "pygpt.train", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / METRICS).exists() and (out / WEIGHTS).exists()):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    assert "continue with --resume" in stderr
    step = json.loads((out / CONFIG).read_text())["step"]
    assert metrics(out)[-1]["step"] == step and step < 100000
    assert "next: python -m pygpt.generate" in stdout
    assert not (out / LOCK).exists()
