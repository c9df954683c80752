"""A disk that fills up (or turns read-only) while pygpt writes: a checkpoint save or an export
the OS refuses is one `error:` line naming the folder and the OS's reason, exit 1, with the
folder's previous contents intact and no staging folder left; the GPT token cache that cannot be
written beside the data goes to the user cache, with a note. The error is injected at the k-th
file pygpt.storage.atomic flushes to disk, or, where this machine can mount one, by a tmpfs too small."""
import errno
import json
import os
import shlex
import subprocess
import sys

import pytest

import pygpt.export
import pygpt.storage.atomic
from helpers import snapshot, state_dicts_equal, train_cli
from pygpt.storage import checkpoint
from pygpt.data import text as data
from pygpt.data.text import TokenFile
from pygpt.tokenizer import CharTokenizer

FULL = os.strerror(errno.ENOSPC)


def fail_at(monkeypatch, k, code=errno.ENOSPC):
    """From the k-th file pygpt.storage.atomic flushes to disk on, the OS refuses with `code`."""
    real, calls = pygpt.storage.atomic._fsync_file, []

    def fsync_file(path):
        calls.append(path)
        if len(calls) >= k:
            raise OSError(code, os.strerror(code))
        real(path)

    monkeypatch.setattr(pygpt.storage.atomic, "_fsync_file", fsync_file)
    return calls


def assert_refused(line, folder):
    assert line.startswith("error: ") and "\n" not in line, line
    assert str(folder) in line and FULL in line and "intact" in line, line
    assert not [p.name for p in folder.iterdir() if p.name.startswith(pygpt.storage.atomic.STAGING)]


# a resumed run writes metrics.jsonl first (1), then the checkpoint: weights, train state,
# tokenizer, config (2-5) and the commit marker (6)
@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_a_save_without_space_is_one_line_and_keeps_the_checkpoint(ckpt, monkeypatch, k):
    before, _ = checkpoint.load(ckpt)
    files = snapshot(ckpt)
    calls = fail_at(monkeypatch, k)
    status, line = train_cli(["--out", str(ckpt), "--resume", "--max-iters", "9", "--quiet"])
    assert len(calls) == k and status == 1
    assert_refused(line, ckpt)
    monkeypatch.undo()
    after, _ = checkpoint.load(ckpt)
    state_dicts_equal(before.state_dict(), after.state_dict())
    assert {name: files[name] for name in files if name != "metrics.jsonl"} == {
        name: b for name, b in snapshot(ckpt).items() if name != "metrics.jsonl"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, trained):
    out = tmp_path_factory.mktemp("export") / "onnx"
    pygpt.export.main(["--ckpt", str(trained[0]), "--out", str(out)])
    return out


# an export writes model.onnx, tokenizer.json, runner.json (1-3) and the commit marker (4)
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_an_export_without_space_is_one_line_and_keeps_the_export(trained, exported,
                                                                  monkeypatch, k):
    files = snapshot(exported)
    calls = fail_at(monkeypatch, k)
    with pytest.raises(SystemExit) as e:
        pygpt.export.main(["--ckpt", str(trained[0]), "--out", str(exported)])
    assert len(calls) == k
    assert_refused(str(e.value.code), exported)
    assert snapshot(exported) == files


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EDQUOT])
def test_a_token_cache_that_cannot_be_written_goes_to_the_user_cache(tmp_path, monkeypatch,
                                                                     capsys, code):
    corpus = tmp_path / "data" / "corpus.txt"
    corpus.parent.mkdir()
    corpus.write_text("to be or not to be\n" * 20, encoding="utf-8")
    user_cache = tmp_path / "user-cache"
    monkeypatch.setattr(data, "USER_CACHE", user_cache)
    real, refused = pygpt.storage.atomic._fsync_file, os.strerror(code)

    def fsync_file(path):
        if path.parent == corpus.parent:
            raise OSError(code, refused)
        real(path)

    monkeypatch.setattr(pygpt.storage.atomic, "_fsync_file", fsync_file)
    tok = CharTokenizer.from_text(corpus.read_text(encoding="utf-8"))
    tokens = TokenFile.load(corpus, tok).tokens
    assert tokens.tolist() == tok.encode(corpus.read_text(encoding="utf-8"))
    assert sorted(p.name for p in corpus.parent.iterdir()) == ["corpus.txt"]
    assert len([p for p in user_cache.iterdir() if ".tokens." in p.name]) == 2
    note = capsys.readouterr().err.strip()
    assert "\n" not in note and refused in note and str(corpus.parent) in note


def test_no_place_for_the_token_cache_is_one_line_from_train(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("to be or not to be\n" * 200, encoding="utf-8")
    monkeypatch.setattr(data, "USER_CACHE", tmp_path / "user-cache")
    fail_at(monkeypatch, 1)
    status, line = train_cli(["--data", str(corpus), "--out", str(tmp_path / "run"),
                              "--tokenizer", "char", "--n-layer", "1", "--n-embd", "16",
                              "--n-head", "2", "--block-size", "8", "--max-iters", "1",
                              "--quiet"])
    assert status == 1 and line.startswith("error: ") and "\n" not in line, line
    assert "cannot write a token cache" in line and FULL in line


def test_a_full_disk_while_appending_metrics_keeps_the_saved_checkpoint(ckpt, monkeypatch):
    import pygpt.training.metrics_log as metrics_log

    def refusing_open(path, mode="r", **kwargs):
        if mode == "a":
            raise OSError(errno.ENOSPC, FULL)
        return open(path, mode, **kwargs)

    monkeypatch.setattr(metrics_log, "open", refusing_open, raising=False)
    status, line = train_cli(["--out", str(ckpt), "--resume", "--max-iters", "9", "--quiet"])
    assert status == 1 and line.startswith("error: ") and "\n" not in line, line
    assert str(ckpt) in line and FULL in line and "metrics.jsonl" in line, line
    assert "step 9 is saved and intact" in line, line
    monkeypatch.undo()
    assert json.loads((ckpt / "config.json").read_text())["step"] == 9
    checkpoint.load(ckpt)


# --- a real full disk: a small tmpfs in a mount namespace of its own ------------------------------

def small_disk_script(script, size_kib):
    """The command running the shell `script` with $DISK a fresh tmpfs of size_kib KiB, mounted
    in a private mount namespace (unprivileged where the kernel allows user namespaces); None
    where this machine cannot mount one."""
    probe = ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt 2>/dev/null "
             "|| mount -t tmpfs -o size=64k tmpfs /tmp"]
    try:
        if subprocess.run(probe, capture_output=True, timeout=60).returncode != 0:
            return None
    except (OSError, subprocess.TimeoutExpired):
        return None
    return ["unshare", "-rm", "sh", "-c",
            f'DISK=$(mktemp -d) && mount -t tmpfs -o size={size_kib}k tmpfs "$DISK" && {script}']


def run_on_a_small_disk(folder, command, room, tmp_path):
    """Copies folder to a tmpfs with `room` bytes free beyond it, runs `command` (its --out the
    copy, $RUN) there, and copies the result back: (exit status, stderr lines, the copy after,
    the copy's path on the tmpfs). Skips where no tmpfs can be mounted."""
    size_kib = (sum(map(len, snapshot(folder).values())) + room) // 1024 + 8
    after = tmp_path / "after"
    run = " ".join('"$RUN"' if arg == "$RUN" else shlex.quote(arg)
                   for arg in [sys.executable, "-m", *command])
    script = small_disk_script(
        f'RUN="$DISK/run" && cp -a "{folder}" "$RUN" && {run}; status=$?; '
        f'cp -a "$RUN" "{after}"; echo "$RUN" >&2; exit $status', size_kib)
    if script is None:
        pytest.skip("this machine cannot mount a tmpfs in a user namespace (unshare -rm)")
    done = subprocess.run(script, capture_output=True, timeout=600)
    err = done.stderr.decode().splitlines()
    return done.returncode, err[:-1], after, err[-1]


def test_a_save_on_a_really_full_disk_is_one_line_and_keeps_the_checkpoint(ckpt, tmp_path):
    """The resumed run's first save needs room for its staged checkpoint, which the tmpfs (half
    the weights and train state free) does not have."""
    files = snapshot(ckpt)
    room = sum(len(files[name]) for name in ("model.safetensors", "train_state.pt")) // 2
    status, err, after, run = run_on_a_small_disk(
        ckpt, ["pygpt.train", "--out", "$RUN", "--resume", "--max-iters", "9", "--quiet"],
        room, tmp_path)
    assert status == 1 and len(err) == 1, err
    assert err[0].startswith("error: ") and run in err[0], err
    assert FULL in err[0] and "intact" in err[0], err
    assert snapshot(after) == files
    before_model, _ = checkpoint.load(ckpt)
    after_model, _ = checkpoint.load(after)
    state_dicts_equal(before_model.state_dict(), after_model.state_dict())


def test_an_export_on_a_really_full_disk_is_one_line_and_keeps_the_export(trained, exported,
                                                                           tmp_path):
    files = snapshot(exported)
    status, err, after, run = run_on_a_small_disk(
        exported, ["pygpt.export", "--ckpt", str(trained[0]), "--out", "$RUN"],
        len(files["model.onnx"]) // 2, tmp_path)
    assert status == 1 and len(err) == 1, err
    assert err[0].startswith("error: ") and run in err[0], err
    assert FULL in err[0] and "intact" in err[0], err
    assert snapshot(after) == files
