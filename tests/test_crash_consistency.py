"""Nothing lost, ever: a process SIGKILLed between any two file operations of a save or an
export leaves a folder that holds the previous whole contents or the new ones, never a mix.

pygpt.storage.atomic's test hook (PYGPT_TEST_KILL_AT=k) kills the process after its k-th file operation, in
a child forked from this one (torch is imported already) for k = 1, 2, ... until the child ends
unkilled: every gap between two operations is cut once (one also in a real subprocess).
After each kill, a checkpoint folder must load (the step before or the step saved), resume with
`pygpt.train --resume`, and end bit for bit where an uninterrupted run ends; an export folder
must be the earlier export or the new one for the torch-free runner, and whole once the next
export took over the killed one's lock and recovered it.
"""
import dataclasses
import itertools
import os
import shutil
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import numpy as np
import pytest

import pygpt.train
from helpers import state_dicts_equal, tiny_train_cfg
from pygpt.storage import checkpoint
from pygpt import export as exporter
from pygpt.onnx import gpt as export_gpt
from pygpt.config import ModelConfig
from pygpt.storage.atomic import KILL_ENV, is_leftover
from pygpt.storage.run_files import CONFIG, ONNX_FP32, RUNNER_CONFIG, TOKENIZER
from pygpt.training import train
from pygpt.training.run_folder import RunFolder
from pygpt_runtime import run_onnx

MODEL = ModelConfig(block_size=16, n_layer=1, n_head=2, n_embd=16)
STEPS = 3  # the whole run; every kill falls into the save of step 2


@pytest.fixture(scope="module", autouse=True)
def no_loss_plot():
    """Runs here draw no loss.png: a picture outside the checkpoint that takes most of a tiny
    run's time (its atomic write is tested in test_checkpoint)."""
    import pygpt.training.loop

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pygpt.training.loop, "plot_runs", lambda *args, **kwargs: None)
        yield


def killed_at(k, work):
    """Runs work() in a forked child with the kill hook at k: True if the child was killed
    there, False if work finished before a k-th file operation."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 1
        try:
            os.environ[KILL_ENV] = str(k)
            work()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return True
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child at k={k}: {status}"
    return False


def kill_sweep(work, check, setup):
    """setup(), then work() killed at k and check(k), for every k until work() ends unkilled;
    returns how many kill points there were."""
    for k in itertools.count(1):
        setup()
        if not killed_at(k, work):
            return k - 1
        check(k)


def weights(folder):
    return checkpoint.load(folder, kernels="torch")[0].state_dict()


@pytest.fixture(scope="module")
def runs(text_file, tmp_path_factory):
    """The configs of a run of STEPS steps saved at every step (its schedule fixed by
    lr_decay_iters, so stopping early changes nothing), the folder of its checkpoint of step 1,
    and the weights of steps 1, 2 and STEPS of an uninterrupted run."""
    root = tmp_path_factory.mktemp("crash")
    cfg = tiny_train_cfg(text_file, root / "straight", max_iters=STEPS, eval_interval=1,
                         eval_iters=1, batch_size=2, warmup_iters=1, lr_decay_iters=STEPS,
                         threads=1)
    train(MODEL, cfg, progress=False)
    step1 = root / "step1"
    train(MODEL, dataclasses.replace(cfg, out=str(step1), max_iters=1), progress=False)
    step2 = root / "step2"
    shutil.copytree(step1, step2)
    train(MODEL, dataclasses.replace(cfg, out=str(step2), max_iters=2), resume=True,
          progress=False)
    return cfg, step1, {1: weights(step1), 2: weights(step2), STEPS: weights(cfg.out)}


def assert_resumes_to_the_straight_run(folder, reference):
    pygpt.train.main(["--resume", "--out", str(folder), "--max-iters", str(STEPS), "--quiet"])
    assert checkpoint.weights_step(folder) == STEPS
    state_dicts_equal(weights(folder), reference[STEPS])
    assert not [p.name for p in folder.iterdir() if is_leftover(p.name)]


def assert_whole_checkpoint(folder, reference, steps):
    """folder loads as the checkpoint of one of steps, weights and training state alike."""
    step = checkpoint.weights_step(folder)
    assert step in steps
    state_dicts_equal(weights(folder), reference[step])
    assert checkpoint.load_train_state(folder)["step"] == step
    return step


def test_kill_at_every_file_operation_of_a_save(runs, tmp_path, capsys):
    cfg, step1, reference = runs
    folder = tmp_path / "run"
    run = dataclasses.replace(cfg, out=str(folder), max_iters=2)
    seen = set()

    def setup():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(step1, folder)

    def check(k):
        seen.add(assert_whole_checkpoint(folder, reference, (1, 2)))
        assert_resumes_to_the_straight_run(folder, reference)

    points = kill_sweep(lambda: train(MODEL, run, resume=True, progress=False), check, setup)
    # mkdir, 4 files, the marker (2), the index, 4 moves, the marker and staging removed:
    # every one of them was cut once
    assert points >= 14 and seen == {1, 2}, (points, seen)


@pytest.fixture(scope="module")
def mid_commit(runs, tmp_path_factory):
    """k such that a resume of the step-1 folder killed at k has committed its save of step 2
    and moved one file into place (the marker is written at the first k that leaves step 2;
    then the index is removed and the first file moved)."""
    cfg, step1, _ = runs
    folder = tmp_path_factory.mktemp("probe") / "run"
    run = dataclasses.replace(cfg, out=str(folder), max_iters=2)
    for k in itertools.count(1):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(step1, folder)
        assert killed_at(k, lambda: train(MODEL, run, resume=True, progress=False))
        if checkpoint.weights_step(folder) == 2:
            return k + 2


def test_kill_while_recovering(runs, mid_commit, tmp_path):
    """A recovery killed between two of its operations is finished by the next one."""
    cfg, step1, reference = runs
    folder = tmp_path / "run"
    run = dataclasses.replace(cfg, out=str(folder), max_iters=2)

    def setup():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(step1, folder)
        assert killed_at(mid_commit, lambda: train(MODEL, run, resume=True, progress=False))
        assert_whole_checkpoint(folder, reference, (2,))

    points = kill_sweep(lambda: checkpoint.recover(folder),  # each time still step 2:
                        lambda k: assert_whole_checkpoint(folder, reference, (2,)), setup)
    assert points >= 4
    checkpoint.recover(folder)
    assert_whole_checkpoint(folder, reference, (2,))
    assert not [p.name for p in folder.iterdir() if is_leftover(p.name)]


def test_kill_during_the_first_save(runs, tmp_path):
    """A run killed in its very first save leaves its checkpoint of step 1 (which resumes), or
    a folder with no checkpoint where a new run starts without --overwrite."""
    cfg, _, reference = runs
    folder = tmp_path / "run"
    run = dataclasses.replace(cfg, out=str(folder), max_iters=1)
    outcomes = set()

    def check(k):
        try:
            checkpoint.read_config(folder)
        except FileNotFoundError:
            outcomes.add("none")
            pygpt.train.main(["--out", str(folder), *flags(run), "--quiet"])
            state_dicts_equal(weights(folder), reference[1])
            return
        outcomes.add("step 1")
        assert_whole_checkpoint(folder, reference, (1,))
        assert_resumes_to_the_straight_run(folder, reference)

    points = kill_sweep(lambda: train(MODEL, run, progress=False), check,
                        lambda: shutil.rmtree(folder, ignore_errors=True))
    assert points >= 10 and outcomes == {"none", "step 1"}, (points, outcomes)


def flags(cfg):
    """The command line of the run cfg (model MODEL) up to its first checkpoint."""
    values = {"n-layer": MODEL.n_layer, "n-embd": MODEL.n_embd, "n-head": MODEL.n_head,
              "block-size": MODEL.block_size, "data": cfg.data, "max-iters": cfg.max_iters,
              "eval-interval": 1, "eval-iters": 1, "batch-size": cfg.batch_size,
              "warmup-iters": cfg.warmup_iters, "lr-decay-iters": cfg.lr_decay_iters,
              "lr": cfg.lr, "min-lr": cfg.min_lr, "seed": cfg.seed, "threads": 1}
    return [arg for name, value in values.items() for arg in (f"--{name}", str(value))]


def test_kill_in_a_real_training_process(runs, mid_commit, tmp_path):
    """The hook in a real `python -m pygpt.train --resume`, killed after its save committed and
    moved the first file: the folder is the checkpoint of step 2 and resumes."""
    _, step1, reference = runs
    folder = tmp_path / "run"
    shutil.copytree(step1, folder)
    env = {**os.environ, KILL_ENV: str(mid_commit), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "pygpt.train", "--resume", "--out", str(folder),
                           "--max-iters", "2", "--quiet"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert [p.name for p in folder.iterdir() if is_leftover(p.name)]  # cut mid-commit
    assert_whole_checkpoint(folder, reference, (2,))
    assert_resumes_to_the_straight_run(folder, reference)


# --- exports ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """Two checkpoints unlike in every file (model, vocabulary, block size) and an export of
    each: the earlier export of a folder and the new one."""
    cfg, step1, _ = runs
    root = tmp_path_factory.mktemp("exports")
    text = root / "other.txt"
    text.write_text("".join("abcdefgh \n"[i * 7 % 10] for i in range(600)), encoding="utf-8")
    other = dataclasses.replace(cfg, data=str(text), out=str(root / "other"), max_iters=2)
    train(dataclasses.replace(MODEL, block_size=8), other, progress=False)
    made = {}
    for name, ckpt in (("old", step1), ("new", Path(other.out))):
        exporter.export(ckpt, root / name)
        made[name] = (ckpt, root / name)
    return made


def runner_logits(folder):
    """(block size, logits of the first tokens) of an export, read by the torch-free runner."""
    model = run_onnx.OnnxGPT(str(folder))
    ids = np.array([model.tokenizer.encode("abc de")[:4]], dtype=np.int64)
    return model.config["block_size"], model.step(ids, model.empty_past(1))[0]


def test_kill_at_every_file_operation_of_an_export(exports, tmp_path, monkeypatch):
    expected = {name: runner_logits(folder) for name, (_, folder) in exports.items()}
    built = exports["new"][1] / ONNX_FP32
    # The child copies the new model.onnx instead of exporting it again (the same file
    # operations, seconds faster); the check against PyTorch still runs on it.
    monkeypatch.setattr(export_gpt, "_to_onnx", lambda model, path: shutil.copyfile(built, path))
    folder = tmp_path / "onnx"
    seen = set()

    def which(folder):
        block, logits = runner_logits(folder)
        name = next(n for n, (b, _) in expected.items() if b == block)
        assert np.array_equal(logits, expected[name][1]), name  # the model of its runner.json
        return name

    def check(k):
        try:  # the runner, knowing nothing of staging: the old, the new, or no runner.json
            raw = which(folder)
        except FileNotFoundError as e:
            assert f"no {RUNNER_CONFIG}" in str(e), e
            raw = None
        exporter.check_out(exports["new"][0], folder)  # an export may go over it again
        with RunFolder(folder, what="export"):  # as the next export: the killed one's lock
            pass  # taken over (and removed), its change recovered
        now = which(folder)
        assert raw in (None, "old", now)  # a committed export shows once it is moved in
        seen.add(now)
        assert sorted(p.name for p in folder.iterdir()) == [ONNX_FP32, RUNNER_CONFIG, TOKENIZER]

    points = kill_sweep(lambda: exporter.export(exports["new"][0], folder), check, lambda: (
        shutil.rmtree(folder, ignore_errors=True), shutil.copytree(exports["old"][1], folder)))
    assert points >= 10 and seen == {"old", "new"}, (points, seen)


def test_export_refuses_folders_it_would_mix_with(exports, tmp_path, capsys):
    ckpt = exports["old"][0]
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    for out, message in [(ckpt, "is the checkpoint folder itself"),
                         (exports["new"][0], "holds a checkpoint"),
                         (stray, "not empty and holds no pygpt export")]:
        before = sorted(p.name for p in Path(out).iterdir())
        with pytest.raises(SystemExit, match=f"^error: .*{message}"):
            exporter.main(["--ckpt", str(ckpt), "--out", str(out)])
        assert sorted(p.name for p in Path(out).iterdir()) == before
    assert (ckpt / CONFIG).is_file()
    assert capsys.readouterr().out == ""
