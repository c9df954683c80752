"""The run folder (`python -m pygpt.train --out`, also an export's `--out`): made ready before
any work starts, locked while a run writes into it, and never holding files of two runs.

Opening it creates it if needed and takes its lock: the file LOCK inside, locked with
fcntl.flock (atomic, and released by the kernel when the process ends however it ends) and
holding the owner's pid, host and what it is (a training run, an export), so a second run or
export into the same folder is refused with a message naming them. A lock file whose lock nobody holds is stale (its run died without
cleaning up; its pid is no longer running) and is taken over. Taking the lock is also the proof
that the folder is writable, found before training starts rather than at the first save. Once
locked, what a killed save left is recovered (pygpt.storage.atomic.recover_folder: a committed save completed,
an uncommitted one and temporary files discarded), so the folder holds whole files only.

A folder may come from elsewhere: a LOCK or run file that is a symbolic link is refused (pygpt
never writes through one). And a folder removed or replaced while its run goes on (its LOCK no
longer the one locked) stops the run at its next write there (pygpt.storage.atomic.guard) with one line,
rather than recreating it without a lock and letting a second run in.

A new run goes only into an empty folder, or with --overwrite into one holding an earlier pygpt
run, recognised by its config.json (a pygpt checkpoint config, as pygpt.storage.checkpoint.read_config
reads it; a folder with an export's runner.json is an export, not a run). Anything else (an
export, another library's model, a stranger's files) is refused by name, whatever it holds: files
are never taken for a run's by their names alone. The earlier run's files (RUN_FILES, named in
pygpt.storage.run_files) go only with the new run's first save, in its commit (pygpt.storage.checkpoint.save's
`remove`), so a run that fails before it leaves the earlier run whole; any other file stays.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Union

from pygpt.storage import checkpoint
from pygpt.config import ModelConfig
from pygpt.config.fields import config_from_dict
from pygpt.storage.atomic import guard, recover_folder, unguard
from pygpt.storage.targets import check_folder, check_target, linked
from pygpt.storage.run_files import (CONFIG, LABELS, LOSS_PLOT, METRICS, RUNNER_CONFIG, TOKENIZER,
                             TRAIN_STATE, WEIGHTS)
from pygpt_runtime.json_file import parse_json

LOCK = ".pygpt-train.lock"
# A run's files: what the first save of a new run (--overwrite) removes of an earlier one.
RUN_FILES = (CONFIG, WEIGHTS, TRAIN_STATE, TOKENIZER, LABELS, METRICS, LOSS_PLOT)


def _open_lock_file(path: Path) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)


def _owner(fd: int) -> dict[str, Any]:
    """The pid and host recorded in an open lock file ({} if it holds none)."""
    try:
        owner = parse_json(os.pread(fd, 4096, 0).decode("utf-8"), "the lock file")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _describe(owner: dict[str, Any]) -> str:
    return f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')}"


def _same_file(fd: int, path: Path) -> bool:
    """Whether path (not followed if a link) is the file open as fd."""
    try:
        here, there = os.fstat(fd), os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


class RunFolder:
    """`with RunFolder(out) as folder:` creates and locks out (rank 0 of a multi-process run
    does, alone); leaving releases the lock and removes the folder again if this created it and
    nothing was written into it. `what` names the holder to a process refused."""

    def __init__(self, path: Union[str, Path], what: str = "training run"):
        self.path, self.what, self._fd, self._created = Path(path), what, None, False

    def __enter__(self) -> "RunFolder":
        check_folder(self.path, "--out")
        self._created = not self.path.exists()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ValueError(f"cannot create the --out folder {self.path}: "
                             f"{e.strerror or e}") from None
        try:
            self._take_lock()
            recover_folder(self.path)
            for name in RUN_FILES:
                check_target(self.path / name, "another --out")
            guard(self.path, self.check_held)
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
                if e.errno == errno.ELOOP:
                    raise linked(path, "another --out") from None
                raise ValueError(f"cannot write into the --out folder {self.path}: "
                                 f"{e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                os.close(fd)
                raise ValueError(f"{self.path} is in use by another "
                                 f"{owner.get('what', 'training run')} ({_describe(owner)}); "
                                 "let it finish or stop it, or pass another --out") from None
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
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "what": self.what}).encode("utf-8"), 0)
        os.fsync(fd)
        self._fd = fd

    def check_held(self) -> None:
        """Raises unless the folder is still the one this locked: its LOCK the file locked (a
        folder removed, or replaced by another, holds another LOCK or none)."""
        if self._fd is None or not _same_file(self._fd, self.path / LOCK):
            raise ValueError(f"{self.path} was removed or replaced while this {self.what} was "
                             "writing into it (its lock is gone); stopped without writing "
                             "there again")

    def __exit__(self, *_: Any) -> None:
        unguard(self.path, self.check_held)
        ours = self._fd is None or _same_file(self._fd, self.path / LOCK)  # not replaced
        if self._fd is not None:
            try:
                if ours:
                    (self.path / LOCK).unlink()  # before unlocking: no one else holds it yet
            finally:
                os.close(self._fd)
                self._fd = None
        if self._created and ours:
            try:
                self.path.rmdir()  # only if still empty: a run that failed before any save
            except OSError:
                pass

    def check_new_run(self, overwrite: bool, resumable: bool = False,
                      continued_by: str = "") -> None:
        """Refuses a new run into a folder that holds anything (a checkpoint, an export, files
        of any other kind), unless overwrite and the folder holds an earlier pygpt run. The
        refusal of a checkpoint says how to continue it: --resume where the command takes it
        (resumable), else the command continued_by names (a prune's recovery cut short
        continues as a training run), if any."""
        held = sorted(n for n in os.listdir(self.path) if n != LOCK)
        if not held:
            return
        if _holds_run(self.path, held):
            if overwrite:
                return
            if resumable:
                raise ValueError(f"{self.path} already holds a checkpoint; pass --resume to "
                                 "continue it, --overwrite to start over, or --out to train "
                                 "elsewhere")
            hint = f" ({continued_by} continues a run cut short)" if continued_by else ""
            raise ValueError(f"{self.path} already holds a checkpoint; pass --overwrite to "
                             f"replace it or another --out{hint}")
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
