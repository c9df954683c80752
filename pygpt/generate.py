"""Sample text from a checkpoint, streaming it as it is generated:

    python -m pygpt.generate --ckpt out/ --prompt "ROMEO:" --max-new-tokens 500

Ctrl-C stops it (exit status 130) with the text so far printed."""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Iterator, Optional

import torch

from pygpt.checkpoint import load
from pygpt.config import KERNEL_SETS
from pygpt.decoding import Generates, Sampling
from pygpt.tokenizer import decode_stream

# What every pygpt command line shares (generate, fill_mask, classify): the --help formatter,
# the UTF-8 check of text arguments and the clean exit on Ctrl-C or a closed pipe.
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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpt.generate", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--ckpt", default="out", help="checkpoint folder")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate")
    p.add_argument("--greedy", action="store_true", help="always take the most likely token")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature (finite, > 0; tiny values approach --greedy)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample among the k most likely (default: all)")
    p.add_argument("--top-p", type=float, default=None,
                   help="nucleus sampling threshold in (0, 1] (default: off)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed for reproducible sampling (default: a fresh one)")
    p.add_argument("--no-cache", action="store_true",
                   help="re-run the whole window per token instead of using the KV cache")
    p.add_argument("--kernels", choices=KERNEL_SETS, default="ext",
                   help="our C++ kernels (ext) or plain PyTorch ops (torch)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's choice)")
    return p


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        if args.max_new_tokens < 0:
            raise ValueError("--max-new-tokens must be >= 0")
        sampling = Sampling(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p)
        if not args.prompt:
            raise ValueError("--prompt must not be empty")
        utf8_text(args.prompt, "--prompt")
        model, tokenizer = load(args.ckpt, kernels=args.kernels)
        if not isinstance(model, Generates):
            raise ValueError(f"{args.ckpt} holds a {model.config.arch} model, which does not "
                             "generate text (a bert fills in masks: python -m pygpt.fill_mask)")
        idx = torch.tensor([tokenizer.encode(args.prompt)], dtype=torch.long)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    with exits_cleanly():
        sys.stdout.write(args.prompt)
        tokens = model.stream(idx, args.max_new_tokens, sampling=sampling,
                              use_cache=not args.no_cache, generator=generator)
        for piece in decode_stream(tokenizer, (int(t[0]) for t in tokens)):
            sys.stdout.write(piece)
            sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
