"""Atomic file writes: everything pygpt saves (checkpoints, tokenizers, exports) goes through
here, so a run killed mid-save leaves the previous file intact, never a half-written one."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Union


def atomic_write(path: Union[str, Path], write: Callable[[Path], None]) -> None:
    """Calls write(tmp) on a temporary path beside `path`, then renames it over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: Union[str, Path], text: str) -> None:
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
