"""The lock every call on a checkpoint's served model holds (python -m pygpt.serve --ckpt), which
also runs the call in the server's number type."""
from __future__ import annotations

import threading
from typing import Any

from pygpt.mixed_precision import autocast


class ModelLock:
    """The lock every call on the served model holds, which also runs the call in the server's
    number type: autocast is per thread, and the calls come from several (the decode worker,
    the task worker, the attention maps)."""

    def __init__(self, dtype: str):
        self.dtype, self._lock, self._autocast = dtype, threading.Lock(), None

    def __enter__(self) -> "ModelLock":
        self._lock.acquire()
        try:
            self._autocast = autocast("cpu", self.dtype)
            self._autocast.__enter__()
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._autocast.__exit__(*exc)
        finally:
            self._lock.release()
