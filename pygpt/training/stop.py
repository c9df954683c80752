"""Stopping a run cleanly on a signal: the first Ctrl-C (SIGINT) or SIGTERM (what `kill`, job
schedulers and container runtimes send) asks the training loop to stop after the current step and
save, ready for --resume; the previous handlers then come back, so a second Ctrl-C interrupts at
once (KeyboardInterrupt) and a second SIGTERM ends the process as it would have without us. The
command line exits with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM), as a shell
reports a process stopped by that signal."""
from __future__ import annotations

import signal
from typing import Any, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """A context that catches the first SIGINT or SIGTERM; `signum` is the one caught (None:
    none yet). Enter it from the main thread (Python delivers signals only there)."""

    def __init__(self) -> None:
        self.signum: Optional[int] = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_status(self) -> int:
        """The status a process stopped by this signal reports: 128 + its number."""
        if self.signum is None:
            raise ValueError("no stop was requested")
        return 128 + self.signum

    def __enter__(self) -> "StopRequest":
        self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def _handle(self, signum: int, _frame: Any) -> None:
        self.signum = signum
        self._restore()

    def _restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def __exit__(self, *_: Any) -> None:
        self._restore()
