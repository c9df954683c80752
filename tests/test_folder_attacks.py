"""A folder that someone else prepared (a run or export folder unpacked from elsewhere, a data
folder shared with others) never makes pygpt touch a file outside it: a commit marker naming
paths that are not plain names of the folder, or damaged, is refused with one line and nothing
is changed; pygpt never writes through a symbolic link (the lock, a staging folder, a temporary
file of an atomic write, a run file); and a run whose folder is removed or replaced under it,
or an export into a folder that another export holds, stops with one line instead of writing
into a folder it does not own. The victims are files beside the folder, in tmp_path."""

import json
import os
import subprocess
import sys

import pytest

import pygpt.train
import pygpt.training.loop as loop
from helpers import TINY_FLAGS
from pygpt import export as exporter
from pygpt.data.text import TokenFile
from pygpt.storage.atomic import MARKER, STAGING, recover_folder
from pygpt.storage.run_files import CONFIG, METRICS, RUNNER_CONFIG, WEIGHTS
from pygpt.tokenizer import CharTokenizer
from pygpt.training.run_folder import LOCK

VICTIM = "precious data\n"


def refused(main, args):
    """The one `error:` line with which main(args) exits."""
    with pytest.raises(SystemExit) as exit_:
        main(args)
    message = exit_.value.code
    assert isinstance(message, str) and message.startswith("error: "), message
    assert "\n" not in message, message
    return message


def victims(tmp_path, *names):
    paths = [tmp_path / name for name in names]
    for path in paths:
        path.write_text(VICTIM)
    return paths


def snapshot(folder):
    """Every entry under folder (links as their targets, not followed) with its contents."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = (
                "-> " + os.readlink(path) if os.path.islink(path)
                else None if os.path.isdir(path) else open(path, "rb").read())
    return found


def stage(folder, marker, pid=99999, files=()):
    """A staging folder in folder holding files and, unless None, the commit marker (written
    as is when a str)."""
    staging = folder / f"{STAGING}{pid}"
    staging.mkdir(parents=True)
    for name in files:
        (staging / name).write_text("staged\n")
    if marker is not None:
        (staging / MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
    return staging


def resume(folder):
    return ["--resume", "--out", str(folder), "--max-iters", "7", "--quiet"]


# --- commit markers -----------------------------------------------------------------------------

def test_a_marker_naming_files_outside_is_refused_by_resume(ckpt, tmp_path):
    outside, beside = victims(tmp_path, "victim.txt", "victim2.txt")
    stage(ckpt, {"written": [], "index": None, "time_ns": 1,
                 "remove": [str(outside), "../victim2.txt"]})
    before = snapshot(ckpt)
    message = refused(pygpt.train.main, resume(ckpt))
    assert "the folder needs a look" in message
    assert outside.read_text() == beside.read_text() == VICTIM
    assert snapshot(ckpt) == before


def test_a_marker_moving_a_file_up_is_refused_by_export(ckpt, tmp_path):
    out = tmp_path / "onnx"
    out.mkdir()
    (out / RUNNER_CONFIG).write_text("{}")  # looks like an earlier export
    (out / "evil.sh").write_text("#!/bin/sh\n")
    stage(out, {"written": ["../evil.sh"], "index": None, "time_ns": 1, "remove": []})
    before = snapshot(out)
    refused(exporter.main, ["--ckpt", str(ckpt), "--out", str(out)])
    assert snapshot(out) == before and not (tmp_path / "evil.sh").exists()


@pytest.mark.parametrize("marker", [
    "not json", '["written"]', {"written": "abc", "index": None, "time_ns": 1, "remove": []},
    {"written": [1], "index": None, "time_ns": 1, "remove": []},
    {"written": [], "index": None, "time_ns": True, "remove": []},
    {"written": [], "index": "../x", "time_ns": 1, "remove": []},
    {"written": [], "index": None, "time_ns": 1, "remove": [None]},
    {"written": [], "index": None, "time_ns": 1, "remove": [".."]},
    {"written": [], "index": None, "time_ns": 1, "remove": ["."]},
    {"written": [], "index": None, "time_ns": 1, "remove": ["a/b"]},
    {"written": [], "index": None, "time_ns": 1, "remove": [""]},
    {"written": ["sub"], "index": None, "time_ns": 1, "remove": []},  # a folder, not staged
    {"written": [CONFIG], "index": None, "time_ns": 1, "remove": []},  # a link, not staged
])
def test_damaged_or_foreign_markers_change_nothing(tmp_path, marker):
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "kept.txt").write_text("kept\n")
    (victim,) = victims(tmp_path, "victim.txt")
    staging = stage(folder, marker)
    (staging / "sub").mkdir()
    (staging / CONFIG).symlink_to(victim)
    stage(folder, None, pid=4242, files=[WEIGHTS])  # uncommitted: would be discarded
    before = snapshot(folder)
    with pytest.raises(ValueError, match="the folder needs a look") as error:
        recover_folder(folder)
    assert "\n" not in str(error.value)
    assert snapshot(folder) == before and victim.read_text() == VICTIM


# --- symbolic links -------------------------------------------------------------------------------

def test_a_linked_lock_file_is_refused(ckpt, tmp_path):
    (victim,) = victims(tmp_path, "victim.txt")
    (ckpt / LOCK).symlink_to(victim)
    message = refused(pygpt.train.main, resume(ckpt))
    assert "symbolic link" in message and LOCK in message
    assert victim.read_text() == VICTIM and (ckpt / LOCK).is_symlink()


def test_a_linked_staging_folder_is_not_followed(ckpt, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.txt").write_text(VICTIM)
    (elsewhere / MARKER).write_text(json.dumps(
        {"written": ["notes.txt"], "index": None, "time_ns": 1, "remove": []}))
    before = snapshot(elsewhere)
    (ckpt / f"{STAGING}99999").symlink_to(elsewhere)
    message = refused(pygpt.train.main, resume(ckpt))
    assert "symbolic link" in message
    assert snapshot(elsewhere) == before and not (ckpt / "notes.txt").exists()


def test_a_linked_run_file_is_refused(ckpt, tmp_path):
    (ckpt / METRICS).unlink()
    (ckpt / METRICS).symlink_to(tmp_path / "created.txt")  # dangling: an append would create it
    message = refused(pygpt.train.main, resume(ckpt))
    assert "symbolic link" in message and METRICS in message
    assert not (tmp_path / "created.txt").exists()


def test_a_run_file_that_is_a_fifo_is_refused(ckpt):
    (ckpt / METRICS).unlink()
    os.mkfifo(ckpt / METRICS)  # an append would block until a reader came
    message = refused(pygpt.train.main, resume(ckpt))
    assert "not a regular file" in message and METRICS in message
    assert (ckpt / METRICS).is_fifo()


def test_the_token_cache_is_not_written_through_a_link(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    text = folder / "text.txt"
    text.write_text("to be or not to be\n" * 50)
    tokenizer = CharTokenizer.from_text(text.read_text())
    TokenFile.load(text, tokenizer)
    caches = sorted(folder.glob(".text.txt.*"))
    for cache in caches:
        cache.unlink()
    (victim,) = victims(tmp_path, "victim.txt")
    tokens = caches[0].name  # .text.txt.<key>.tokens.uint16 (the metadata's name is longer)
    (folder / f".{tokens}.tmp-{os.getpid()}").symlink_to(victim)  # the atomic write's temp name
    loaded = TokenFile.load(text, tokenizer)
    assert victim.read_text() == VICTIM
    assert loaded.tokens.tolist() == tokenizer.encode(text.read_text())


# --- a folder that is no longer this process's -----------------------------------------------------

HOLD = ("import sys, time\nfrom pygpt.training.run_folder import RunFolder\n"
        "RunFolder(sys.argv[1], what=sys.argv[2]).__enter__()\nprint('locked', flush=True)\n"
        "time.sleep(120)\n")


def hold(folder, what):
    """A process holding folder's lock as a run of kind `what` does (kill it when done)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(folder), what],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


@pytest.mark.parametrize("then", ["removed", "taken by another run"])
def test_a_run_whose_folder_goes_away_stops_at_its_next_save(text_file, tmp_path, monkeypatch,
                                                              then):
    out = tmp_path / "run"
    holders = []
    append = loop.append_metrics

    def append_then_lose_the_folder(folder, record):
        append(folder, record)
        if record["step"] == 2:
            for path in sorted(out.iterdir()):
                path.unlink()
            out.rmdir()
            if then != "removed":
                holders.append(hold(out, "training run"))

    monkeypatch.setattr(loop, "append_metrics", append_then_lose_the_folder)
    try:
        message = refused(pygpt.train.main, TINY_FLAGS + [
            "--threads", "1", "--data", str(text_file), "--out", str(out), "--max-iters", "4",
            "--eval-interval", "2"])
        assert "removed or replaced" in message
        if then == "removed":
            assert not out.exists()
        else:  # the other run's folder holds its lock alone
            assert sorted(p.name for p in out.iterdir()) == [LOCK]
            assert json.loads((out / LOCK).read_text())["pid"] == holders[0].pid
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def test_an_export_into_a_folder_another_export_holds_is_refused(ckpt, tmp_path):
    out = tmp_path / "onnx"
    holder = hold(out, "export")
    try:
        message = refused(exporter.main, ["--ckpt", str(ckpt), "--out", str(out)])
        assert f"in use by another export (pid {holder.pid}" in message
        assert sorted(p.name for p in out.iterdir()) == [LOCK]
    finally:
        holder.kill()
        holder.wait()
