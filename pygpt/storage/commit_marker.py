"""The commit marker of a folder change (pygpt.storage.atomic.FolderWrite): the file COMMITTED in its staging
folder, whose presence is the commit and whose lists name the files the change wrote (staged,
to move into the folder), the one moved in last (the index) and those it removes.

A folder may come from elsewhere, so a marker is trusted only as far as it names what FolderWrite
itself could have staged: plain names (is_plain_name: no path separator, no leading dot, so not
"." nor ".."), written files that are regular files of the staging folder (not links), and no
name of a folder. Anything else, or a damaged marker, is a ValueError before recovery touches
anything, never a file moved or deleted outside the folder.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Optional

from pygpt_runtime.json_file import parse_json

MARKER = "COMMITTED"


def is_plain_name(name: object) -> bool:
    """Whether name is one FolderWrite writes or removes: a file name of the folder itself (no
    separator, no leading dot: not "." nor ".." nor a staging or temporary name), not MARKER."""
    return (isinstance(name, str) and name != "" and not name.startswith(".")
            and not any(c in name for c in ("/", os.sep, "\0")) and name != MARKER)


def _staged_file(path: Path) -> bool:
    """Whether path is absent (moved into place already) or a regular file, not a link."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return True


def read_marker(staging: Path) -> Optional[dict]:
    """The change committed in the staging folder staging (its marker: written, remove, index,
    time_ns), or None if it was never committed; a one-line ValueError for a marker that is
    damaged or names anything FolderWrite could not have staged (module docstring)."""
    path = staging / MARKER

    def refuse(problem: object) -> ValueError:
        return ValueError(f"{problem}; the folder needs a look (nothing was changed)")

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as e:  # a link among them
        raise refuse(f"{path} cannot be read ({e.strerror or e})") from None
    try:
        with open(fd, encoding="utf-8") as f:
            marker = parse_json(f.read(), str(path))
    except UnicodeDecodeError as e:
        raise refuse(f"{path} is damaged (not UTF-8: {e.reason} at byte {e.start})") from None
    except OSError as e:
        raise refuse(f"{path} cannot be read ({e.strerror or e})") from None
    except ValueError as e:
        raise refuse(e) from None
    if not (isinstance(marker, dict) and isinstance(marker.get("written"), list)
            and isinstance(marker.get("remove"), list) and type(marker.get("time_ns")) is int):
        raise refuse(f"{path} is not a commit marker")
    index = marker.get("index")
    named = marker["written"] + marker["remove"] + ([] if index is None else [index])
    folder = staging.parent
    foreign = [name for name in named if not is_plain_name(name)
               or ((folder / name).is_dir() and not (folder / name).is_symlink())
               or (name in marker["written"] and not _staged_file(staging / name))]
    if foreign:
        raise refuse(f"{path} names {foreign[0]!r}, not a file of the folder that pygpt staged")
    return marker
