"""The command-line rules of the runner and of pygpt's commands, torch-free: the sampling flags
and their checks, the checks of --threads and of text arguments, the --help formatter, the clean
exit on Ctrl-C or a closed pipe. pygpt's commands take them from here; the sampling checks
mirror pygpt.decoding.sampling.Sampling's, which this package cannot import;
tests/test_runner_cli.py holds the two command lines to the same refusals."""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from typing import Iterator, Optional

MAX_SEED = 2 ** 64 - 1  # the largest seed both numpy's and torch's generators take
INTERRUPTED = 130  # exit status after Ctrl-C (128 + SIGINT), as a shell reports it
BROKEN_PIPE = 141  # exit status when the reader of stdout went away (128 + SIGPIPE)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """--help with the module docstring as written (its example commands keep their lines) and
    every flag's default: argparse's, unless the help already says it in words (or the flag is
    required)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.required:
            return text
        return super()._get_help_string(action)


def add_sampling_flags(p: argparse.ArgumentParser, scope: str = "",
                       top_k_also: str = "") -> None:
    """The flags of text generation (python -m pygpt.generate, and the runner's GPT): how many
    tokens and how each is drawn. scope prefixes each help (the runner's "gpt: "); top_k_also
    ends --top-k's help (another family's use of the flag)."""
    p.add_argument("--max-new-tokens", type=int, default=500, help=f"{scope}tokens to generate")
    p.add_argument("--greedy", action="store_true",
                   help=f"{scope}always take the most likely token")
    p.add_argument("--temperature", type=float, default=1.0,
                   help=f"{scope}sampling temperature (finite, > 0; tiny values approach --greedy)")
    p.add_argument("--top-k", type=int, default=None,
                   help=f"{scope}sample among the k most likely (default: all){top_k_also}")
    p.add_argument("--top-p", type=float, default=None,
                   help=f"{scope}nucleus sampling threshold in (0, 1] (default: off)")
    p.add_argument("--seed", type=seed, default=None,
                   help=f"{scope}seed for reproducible sampling, 0..2^64-1 (default: a fresh one)")


def seed(text: str) -> int:
    """--seed's type: an integer in 0..MAX_SEED."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text[:40]!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be in 0..2^64-1, got {text[:40]}")
    return value


def check_sampling(greedy: bool, temperature: float, top_k: Optional[int],
                   top_p: Optional[float], max_new_tokens: int) -> None:
    """A ValueError for the values pygpt.generate refuses, with its words."""
    if max_new_tokens < 0:
        raise ValueError("--max-new-tokens must be >= 0")
    if not greedy and not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number > 0 (for argmax decoding use "
                         f"greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def check_threads(threads: Optional[int]) -> None:
    """A ValueError for a --threads that is given but not a positive count (torch refuses 0,
    onnxruntime would take it as its own choice)."""
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")


def utf8_text(value: str, flag: str) -> str:
    """value, or a ValueError naming flag when it holds bytes that are not UTF-8 (argv bytes
    reach Python as lone surrogates, which no tokenizer or terminal can take)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = value[e.start].encode("utf-8", "surrogateescape")
        raise ValueError(f"{flag} is not valid UTF-8 (byte 0x{bad.hex()} at character "
                         f"{e.start})") from None
    return value


@contextlib.contextmanager
def exits_cleanly() -> Iterator[None]:
    """Ctrl-C ends the command with status 130 and one line on stderr, after the text already
    written (flushed, with a final newline); a closed stdout (`... | head`) ends it quietly with
    status 141. Neither prints a traceback."""
    try:
        yield
    except KeyboardInterrupt:
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except BrokenPipeError:
            _discard_stdout()
        print("interrupted", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
    except BrokenPipeError:
        _discard_stdout()
        raise SystemExit(BROKEN_PIPE) from None


def _discard_stdout() -> None:
    """Points stdout at /dev/null, so the flush at interpreter exit does not fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
