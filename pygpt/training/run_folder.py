"""The run folder (`python -m pygpt.train --out`): made ready before any work starts, locked
while a run writes into it, and never holding files of two runs.

Opening it creates it if needed and takes its lock: the file LOCK inside, locked with
fcntl.flock (atomic, and released by the kernel when the process ends however it ends) and
holding the owner's pid and host, so a second run into the same folder is refused with a
message naming them. A lock file whose lock nobody holds is stale (its run died without
cleaning up; its pid is no longer running) and is taken over. Taking the lock is also the proof
that the folder is writable, found before training starts rather than at the first save. Once
locked, what a killed save left is recovered (pygpt.io.recover_folder: a committed save completed,
an uncommitted one and temporary files discarded), so the folder holds whole files only.

A new run goes only into an empty folder, or with --overwrite into one holding an earlier pygpt
run, recognised by its config.json (a pygpt checkpoint config, as pygpt.checkpoint.read_config
reads it; a folder with an export's runner.json is an export, not a run). Anything else (an
export, another library's model, a stranger's files) is refused by name, whatever it holds: files
are never taken for a run's by their names alone. The earlier run's files (RUN_FILES, named in
pygpt.run_files) go only with the new run's first save, in its commit (pygpt.checkpoint.save's
`remove`), so a run that fails before it leaves the earlier run whole; any other file stays.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Union

from pygpt import checkpoint
from pygpt.config import ModelConfig, config_from_dict
from pygpt.io import recover_folder
from pygpt.run_files import (CONFIG, LABELS, LOSS_PLOT, METRICS, RUNNER_CONFIG, TOKENIZER,
                             TRAIN_STATE, WEIGHTS)

LOCK = ".pygpt-train.lock"
# A run's files: what the first save of a new run (--overwrite) removes of an earlier one.
RUN_FILES = (CONFIG, WEIGHTS, TRAIN_STATE, TOKENIZER, LABELS, METRICS, LOSS_PLOT)


def _open_lock_file(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)


def _owner(fd: int) -> dict[str, Any]:
    """The pid and host recorded in an open lock file ({} if it holds none)."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict[str, Any]) -> str:
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


class RunFolder:
    """`with RunFolder(out) as folder:` creates and locks out (rank 0 of a multi-process run
    does, alone); leaving releases the lock and removes the folder again if this created it and
    nothing was written into it."""

    def __init__(self, path: Union[str, Path]):
        self.path, self._fd, self._created = Path(path), None, False

    def __enter__(self) -> "RunFolder":
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--out {self.path} is a file, not a folder")
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the --out folder {self.path}: "
                             f"{e.strerror or e}") from None
        try:
            self._take_lock()
            recover_folder(self.path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _take_lock(self) -> None:
        path = self.path / LOCK
        while True:
            try:
                fd = _open_lock_file(path)
            except OSError as e:
                raise ValueError(f"cannot write into the --out folder {self.path}: "
                                 f"{e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                os.close(fd)
                raise ValueError(f"{self.path} is in use by another training run "
                                 f"({_describe(owner)}); let it finish or stop it, or pass "
                                 "another --out") from None
            except OSError as e:  # a file system without locks: run, but say so
                print(f"warning: cannot lock {path} ({e.strerror or e}); make sure no other "
                      "run writes into this folder", file=sys.stderr)
            if _same_file(fd, path):
                break
            os.close(fd)  # released and removed between our open and flock: lock the new one
        stale = _owner(fd)
        if stale:
            print(f"note: taking over the lock of {self.path}, left by {_describe(stale)}, "
                  "which is no longer running", file=sys.stderr)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
                  .encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd

    def __exit__(self, *_: Any) -> None:
        if self._fd is not None:
            try:
                if _same_file(self._fd, self.path / LOCK):
                    (self.path / LOCK).unlink()  # before unlocking: no one else holds it yet
            finally:
                os.close(self._fd)
                self._fd = None
        if self._created:
            try:
                self.path.rmdir()  # only if still empty: a run that failed before any save
            except OSError:
                pass

    def check_new_run(self, overwrite: bool) -> None:
        """Refuses a new run into a folder that holds anything (a checkpoint, an export, files
        of any other kind), unless overwrite and the folder holds an earlier pygpt run."""
        held = sorted(n for n in os.listdir(self.path) if n != LOCK)
        if not held:
            return
        if _holds_run(self.path, held):
            if overwrite:
                return
            raise ValueError(f"{self.path} already holds a checkpoint; pass --resume to continue "
                             "it, --overwrite to start over, or --out to train elsewhere")
        shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        if overwrite:
            what = "an ONNX export" if RUNNER_CONFIG in held else "files that are not a pygpt run"
            raise ValueError(f"--out {self.path} holds {what} ({shown}), which --overwrite never "
                             "replaces; choose another folder")
        raise ValueError(f"{self.path} is not empty (it holds {shown}); train into an empty or "
                         "new --out (--overwrite starts over only in a folder holding an earlier "
                         "pygpt run)")


def _holds_run(path: Path, held: list[str]) -> bool:
    """Whether the folder path, holding the files `held`, is an earlier pygpt run: its
    config.json is a pygpt checkpoint config whose model settings are pygpt's (as --resume reads
    them), and it holds no export's runner.json."""
    if CONFIG not in held or RUNNER_CONFIG in held:
        return False
    try:
        config_from_dict(ModelConfig, checkpoint.read_config(path)["model"])
    except (OSError, TypeError, ValueError):
        return False
    return True
