"""A disk that fills up (or turns read-only) while pygpt writes: a checkpoint save or an export
the OS refuses is one `error:` line naming the folder and the OS's reason, exit 1, with the
folder's previous contents intact and no staging folder left; the GPT token cache that cannot be
written beside the data goes to the user cache, with a note. The error is injected at the k-th
file pygpt.io flushes to disk."""
import errno
import os

import pytest

import pygpt.export
import pygpt.io
from helpers import snapshot, state_dicts_equal, train_cli
from pygpt import checkpoint
from pygpt.data import text as data
from pygpt.data.text import TokenFile
from pygpt.tokenizer import CharTokenizer

FULL = os.strerror(errno.ENOSPC)


def fail_at(monkeypatch, k, code=errno.ENOSPC):
    """From the k-th file pygpt.io flushes to disk on, the OS refuses with `code`."""
    real, calls = pygpt.io._fsync_file, []

    def fsync_file(path):
        calls.append(path)
        if len(calls) >= k:
            raise OSError(code, os.strerror(code))
        real(path)

    monkeypatch.setattr(pygpt.io, "_fsync_file", fsync_file)
    return calls


def assert_refused(line, folder):
    assert line.startswith("error: ") and "\n" not in line, line
    assert str(folder) in line and FULL in line and "intact" in line, line
    assert not [p.name for p in folder.iterdir() if p.name.startswith(pygpt.io.STAGING)]


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
    real, refused = pygpt.io._fsync_file, os.strerror(code)

    def fsync_file(path):
        if path.parent == corpus.parent:
            raise OSError(code, refused)
        real(path)

    monkeypatch.setattr(pygpt.io, "_fsync_file", fsync_file)
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
