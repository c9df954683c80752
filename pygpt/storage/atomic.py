"""Atomic writes: everything pygpt saves goes through here, so a process killed mid-save leaves
the previous contents whole, never a half-written file or a folder of mixed saves.

- `atomic_write(path, write)`: one file, written beside its place and renamed over it.
- `FolderWrite` (a checkpoint, an export): several files that change *as a whole*. They are
  written and fsynced into a staging folder inside the target, `.staging-<pid>/`; then a marker
  (`COMMITTED`, written atomically) lists the files written and those to remove: that is the
  commit. Then the files are moved into place, the marker and the staging folder removed. A
  folder's `index` file (config.json, runner.json) is removed first and moved in last, so a
  reader that knows nothing of staging sees the old whole, the new whole, or no index (an
  incomplete folder, refused), never a mix.
- `recover_folder(folder)`: after a kill, rolls a committed change forward and discards an
  uncommitted one (the previous contents are intact), and deletes the temporary files of killed
  atomic writes. Writers call it before writing; one writer per folder at a time.
- `committed_path(folder, name)`: where a reader finds the committed `name` without writing
  (a reader may lack write permission): in the staging folder of a committed change that has
  not moved it yet, else in the folder; `read_committed` reads it there.
- `guard(folder, check)`: the owner of a folder (pygpt.training.run_folder's lock) has every
  write into it call check() first, which raises once the folder is no longer the one it
  locked (removed or replaced): its writer stops instead of writing into another folder.

A folder may come from elsewhere, so nothing here writes over anything but a regular file
(pygpt.storage.targets), and recovery trusts no marker (pygpt.storage.commit_marker.read_marker):
a damaged one, or one naming anything but plain names of the folder that its change staged, is
refused with a ValueError before anything is touched, as is a staging folder that is a link.

A save the OS refuses (no space left, a read-only disk, a quota) discards the staging folder
and raises an OSError naming the folder, with the OS's reason, saying the previous contents are
intact. Every file is given the mode a plain open() gives (0666 less the umask), also where the
writing library creates 0600 files.

Test hook: with the environment variable PYGPT_TEST_KILL_AT=k, the process SIGKILLs itself right
after its k-th file operation here (a file written, renamed, moved or removed, a folder created
or removed), so tests can cut a save between any two operations (tests/test_crash_consistency)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, Optional, Sequence, TypeVar, Union

from pygpt.storage.commit_marker import MARKER, is_plain_name, read_marker
from pygpt.storage.targets import check_target

KILL_ENV = "PYGPT_TEST_KILL_AT"
STAGING = ".staging-"
_TMP = ".tmp-"
_STAGING = re.compile(rf"{re.escape(STAGING)}\d+")  # a staging folder's name
_LEFTOVER = re.compile(rf"{_STAGING.pattern}|\..+{re.escape(_TMP)}\d+")
T = TypeVar("T")
_ops = {"pid": 0, "count": 0}  # file operations of this process, for the test hook
_guards: dict[str, Callable[[], None]] = {}  # folder (absolute) -> its owner's check


def guard(folder: Union[str, Path], check: Callable[[], None]) -> None:
    """Has every write into folder call check() first (module docstring)."""
    _guards[os.path.abspath(folder)] = check


def unguard(folder: Union[str, Path], check: Callable[[], None]) -> None:
    """Ends guard(folder, check) (another owner's check stays)."""
    if _guards.get(os.path.abspath(folder)) == check:
        del _guards[os.path.abspath(folder)]


def _check_owner(folder: Path) -> None:
    """Raises (the owner's check) if folder has an owner that no longer holds it."""
    check = _guards.get(os.path.abspath(folder))
    if check is not None:
        check()


def _file_op() -> None:
    """Counts a file operation; the test hook (module docstring) kills the process at the k-th."""
    kill_at = os.environ.get(KILL_ENV)
    if kill_at is None:
        return
    if _ops["pid"] != os.getpid():  # a forked child counts its own operations
        _ops.update(pid=os.getpid(), count=0)
    _ops["count"] += 1
    if str(_ops["count"]) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_file(path: Path) -> None:
    """Flushes path to disk and gives it the mode of a file created by open()."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())
    os.chmod(path, 0o666 & ~_umask())


def _fsync_dir(path: Path) -> None:
    """Makes the renames in folder path durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Union[str, Path], write: Callable[[Path], None]) -> None:
    """Calls write(tmp) on a temporary path beside `path`, then renames it over `path`."""
    path = Path(path)
    check_target(path)
    _check_owner(path.parent)
    tmp = path.with_name(f".{path.name}{_TMP}{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)  # a killed writer's, or a link: never written through
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
        write(tmp)
        _fsync_file(tmp)
        _file_op()
        os.replace(tmp, path)
        _file_op()
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Union[str, Path], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class FolderWrite:
    """One change of a folder, made as a whole:

        with FolderWrite(out, index=CONFIG, remove=[TRAIN_STATE]) as change:
            change.write(WEIGHTS, lambda path: ...)   # each file written into staging
        # leaving the block commits; an exception discards the staged files

    `remove`: files of the folder that the change deletes unless it writes them (a file of the
    previous contents that this one lacks)."""

    def __init__(self, folder: Union[str, Path], index: Optional[str] = None,
                 remove: Sequence[str] = ()):
        self.folder = Path(folder)
        self.index = index
        self.remove = list(remove)
        self.staging = self.folder / f"{STAGING}{os.getpid()}"
        self.written: list[str] = []

    def __enter__(self) -> "FolderWrite":
        _check_owner(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        recover_folder(self.folder)
        self.staging.mkdir()
        _fsync_dir(self.folder)
        _file_op()
        return self

    def path(self, name: str) -> Path:
        """Where the change stages `name` (to read back a file written earlier)."""
        return self.staging / name

    def write(self, name: str, write: Callable[[Path], None]) -> Path:
        """Calls write(path) on name's staging path and flushes the file; returns the path."""
        if not is_plain_name(name):
            raise ValueError(f"not a plain file name for {self.folder}: {name!r}")
        check_target(self.folder / name)
        write(self.path(name))
        _fsync_file(self.path(name))
        _file_op()
        if name not in self.written:
            self.written.append(name)
        return self.path(name)

    def __exit__(self, kind: Optional[type], error: Optional[BaseException],
                 trace: Optional[TracebackType]) -> None:
        if kind is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            _check_owner(self.folder)  # a folder removed under the writer: say so instead
            if isinstance(error, OSError):  # a save the OS refused (module docstring)
                raise OSError(error.errno, f"cannot save ({error.strerror or error}); its "
                              "previous contents are intact", str(self.folder)) from None
            return
        _fsync_dir(self.staging)
        _check_owner(self.folder)
        marker = {"written": self.written, "index": self.index, "time_ns": time.time_ns(),
                  "remove": [name for name in self.remove if name not in self.written]}
        try:
            atomic_write_text(self.staging / MARKER, json.dumps(marker))
        except OSError as e:  # not committed: discarded as any failed change
            return self.__exit__(type(e), e, e.__traceback__)
        _fsync_dir(self.staging)
        _roll_forward(self.folder, self.staging, marker)

    def files(self) -> list[Path]:
        """The folder's paths of the files written."""
        return [self.folder / name for name in self.written]


def _changes(folder: Path) -> list[tuple[Path, Optional[dict]]]:
    """The staging folders in folder with their markers (None: uncommitted), committed ones in
    the order they were committed; a ValueError for a staging folder that is a link."""
    try:
        stagings = [p for p in folder.iterdir() if _STAGING.fullmatch(p.name)
                    and (p.is_symlink() or p.is_dir())]
    except FileNotFoundError:
        return []
    for p in stagings:
        if p.is_symlink():
            raise ValueError(f"{p} is a symbolic link, not a staging folder of pygpt; the "
                             "folder needs a look (nothing was changed)")
    found = [(p, read_marker(p)) for p in sorted(stagings)]
    return sorted(found, key=lambda change: change[1]["time_ns"] if change[1] else 0)


def _roll_forward(folder: Path, staging: Path, marker: dict) -> None:
    """Finishes a committed change: its files moved into place (the index last), the removed
    ones deleted, then the marker and staging folder removed. Safe to repeat after a kill."""
    index = marker.get("index")
    if index in marker["written"] and (staging / index).exists():
        (folder / index).unlink(missing_ok=True)
        _file_op()
    for name in marker["remove"]:
        if (folder / name).exists():
            (folder / name).unlink(missing_ok=True)
            _file_op()
    for name in sorted(marker["written"], key=lambda name: name == index):  # the index last
        if (staging / name).exists():
            os.replace(staging / name, folder / name)
            _file_op()
    _fsync_dir(folder)
    (staging / MARKER).unlink(missing_ok=True)
    _file_op()
    shutil.rmtree(staging, ignore_errors=True)
    _file_op()


def recover_folder(folder: Union[str, Path]) -> None:
    """Completes or discards the changes a killed writer left in folder (module docstring) and
    deletes the temporary files of its atomic writes. Nothing to do costs one listing."""
    folder = Path(folder)
    for staging, marker in _changes(folder):
        if marker is None:
            shutil.rmtree(staging, ignore_errors=True)
            _file_op()
        else:
            _roll_forward(folder, staging, marker)
    if folder.is_dir():
        for path in folder.iterdir():
            if is_leftover(path.name) and path.is_file():
                path.unlink(missing_ok=True)
                _file_op()


def is_leftover(name: str) -> bool:
    """Whether name in a folder is a staging folder or a temporary file of this module (left by
    a killed writer until recover_folder), not a file of the folder's own contents."""
    return _LEFTOVER.fullmatch(name) is not None


def committed_path(folder: Union[str, Path], name: str) -> Path:
    """Where the committed contents of folder/name are now, without writing anything: in the
    staging folder of a committed change that has not moved it into place yet, else in the
    folder. A name that a committed change removes gives a path that does not exist."""
    folder = Path(folder)
    path = folder / name
    for staging, marker in _changes(folder):
        if marker is None:
            continue
        if name in marker["written"]:  # the newest committed change naming it decides
            path = staging / name if (staging / name).exists() else folder / name
        elif name in marker["remove"]:
            path = staging / name  # never staged: absent
    return path


def read_committed(folder: Union[str, Path], name: str, read: Callable[[Path], T],
                   missing: Optional[str] = None) -> T:
    """read(path) of the committed folder/name (committed_path); if a writer moved the staged
    file into place between finding and reading it, reads it where it went. Without the file:
    FileNotFoundError(missing), if given."""
    path = committed_path(folder, name)
    try:
        try:
            return read(path)
        except FileNotFoundError:
            if path.parent == Path(folder):
                raise
        return read(committed_path(folder, name))
    except FileNotFoundError:
        if missing is None:
            raise
        raise FileNotFoundError(missing) from None
