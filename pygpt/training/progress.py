"""The training progress shown on stderr: tqdm's bar on a terminal; elsewhere (a log file, a
pipe) a plain line every `interval` seconds, since a bar's carriage-return frames would fill a log
with thousands of redrawn lines that a reader of it cannot use."""
from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

from tqdm import tqdm

LOG_INTERVAL_S = 30.0


class Progress:
    """Steps of a run from `initial` to `total`; nothing at all when not `enabled`."""

    def __init__(self, total: int, initial: int, enabled: bool,
                 stream: Optional[TextIO] = None, interval: float = LOG_INTERVAL_S):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled, self.total, self.step, self.interval = enabled, total, initial, interval
        self.bar = (tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True,
                         mininterval=0.5, file=self.stream)
                    if enabled and self.stream.isatty() else None)
        self.last_line = time.monotonic()

    def update(self, loss: float, tokens_per_s: float) -> None:
        """One step done, with its loss and speed."""
        self.step += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}", refresh=False)
        elif self.enabled and time.monotonic() - self.last_line >= self.interval:
            self.last_line = time.monotonic()
            print(f"step {self.step}/{self.total}: loss {loss:.4f}, {tokens_per_s:,.0f} tokens/s",
                  file=self.stream, flush=True)

    def write(self, line: str) -> None:
        """A line of the run's report (on stdout), above the bar if there is one."""
        if self.bar is not None:
            self.bar.write(line)
        else:
            print(line, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
