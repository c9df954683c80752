"""What pygpt may write over: a regular file, or nothing. A symbolic link, a FIFO, a device, a
socket or a folder at a path pygpt writes is refused with one line, never replaced by a file: a
rename over a link replaces the link its owner made, over a FIFO the pipe a reader waits on.
Every write of pygpt.storage.atomic holds its target to this rule, and the run folders
(pygpt.training.run_folder) hold their files to it before a run starts.

A folder a command is told to write (--out) or to read from elsewhere (convert --from-hf) is
the folder itself or nothing (check_folder): a symbolic link to one is refused, never followed
to where it points."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Union


def linked(path: Path, instead: str = "another path") -> ValueError:
    """The error for a symbolic link where pygpt would write; instead: what to pass then."""
    return ValueError(f"{path} is a symbolic link; pygpt never writes through one: remove it "
                      f"(or pass {instead})")


def check_folder(path: Union[str, Path], flag: str) -> None:
    """A ValueError naming flag unless path is absent or a folder itself: a symbolic link (to a
    folder or not) or any other kind of file is refused."""
    path = Path(path)
    if path.is_symlink():
        raise ValueError(f"{flag} {path} is a symbolic link, which pygpt does not follow: pass "
                         "the folder itself")
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {path} is a file, not a folder")


def check_target(path: Union[str, Path], instead: str = "another path") -> None:
    """A ValueError unless path is absent or a regular file, what a write here replaces: a
    symbolic link (linked), a FIFO, a device, a socket or a folder is left as it is (a reader
    of the FIFO, the link's owner, expect it to stay). instead: what to pass then."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return
    if stat.S_ISLNK(mode):
        raise linked(path, instead)
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise ValueError(f"{path} is {kind}; pygpt writes only over a regular file: remove it "
                         f"(or pass {instead})")
