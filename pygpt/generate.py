"""Sample text from a checkpoint, streaming it as it is generated:

    python -m pygpt.generate --ckpt out/ --prompt "ROMEO:" --max-new-tokens 500

Several prompts (--prompt given more than once, or --prompt-file with one prompt per line) are
decoded together in one batch and printed when done, each under a "=== prompt N ===" line; each
gets the text it gets alone (with --seed, each samples as it would alone with that seed).
Ctrl-C stops it (exit status 130) with the text so far printed."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional

import torch

from pygpt.mixed_precision import autocast
from pygpt.storage.checkpoint import load
from pygpt.config.flags import add_model_flags, use_threads
from pygpt.decoding.sampling import Generates, Sampling
from pygpt_runtime.cli_checks import (HelpFormatter, add_sampling_flags, exits_cleanly,
                                      utf8_text)
from pygpt_runtime.text import decode_stream


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pygpt.generate", description=__doc__,
                                formatter_class=HelpFormatter)
    p.add_argument("--ckpt", default="out", help="checkpoint folder")
    p.add_argument("--prompt", action="append", default=None,
                   help="text to continue (default: a newline); give it again for more prompts, "
                        "decoded together")
    p.add_argument("--prompt-file", default=None,
                   help="a UTF-8 file of prompts, one per line, decoded together")
    add_sampling_flags(p)
    p.add_argument("--no-cache", action="store_true",
                   help="re-run the whole window per token instead of using the KV cache")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: torch's choice)")
    add_model_flags(p)
    return p


def main(argv: Optional[list[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        use_threads(args.threads)
        if args.max_new_tokens < 0:
            raise ValueError("--max-new-tokens must be >= 0")
        sampling = Sampling(greedy=args.greedy, temperature=args.temperature, top_k=args.top_k,
                            top_p=args.top_p)
        prompts = read_prompts(args)
        model, tokenizer = load(args.ckpt, kernels=args.kernels)
        if not isinstance(model, Generates):
            raise ValueError(f"{args.ckpt} holds a {model.config.arch} model, which does not "
                             "generate text (a bert fills in masks: python -m pygpt.fill_mask)")
        ids = [encode(tokenizer, text, i, len(prompts)) for i, text in enumerate(prompts)]
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from None
    options = dict(sampling=sampling, use_cache=not args.no_cache)
    with exits_cleanly(), autocast("cpu", args.dtype):
        try:
            write_text(args, model, tokenizer, prompts, ids, options)
        except ValueError as e:  # outputs that are not finite numbers: after the text so far
            sys.stdout.write("\n")
            sys.stdout.flush()
            raise SystemExit(f"error: {e}") from None


def write_text(args: argparse.Namespace, model: Generates, tokenizer, prompts: list[str],
               ids: list[list[int]], options: dict) -> None:
    """Prints the prompt and its continuation as it is sampled, or, for several prompts, each
    one's text when the batch is done."""
    if len(prompts) > 1:
        generators = (None if args.seed is None else
                      [torch.Generator().manual_seed(args.seed) for _ in prompts])
        write_batch(model, tokenizer, prompts, ids, args.max_new_tokens,
                    generator=generators, **options)
        return
    generator = torch.Generator().manual_seed(args.seed) if args.seed is not None else None
    sys.stdout.write(prompts[0])
    tokens = model.stream(torch.tensor([ids[0]], dtype=torch.long), args.max_new_tokens,
                          generator=generator, **options)
    for piece in decode_stream(tokenizer, (int(t[0]) for t in tokens)):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()


def read_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of --prompt (each) and --prompt-file (each line), checked: none empty, all
    valid UTF-8; a newline when neither is given."""
    prompts = []
    for text in args.prompt or []:
        if not text:
            raise ValueError("--prompt must not be empty")
        prompts.append(utf8_text(text, "--prompt"))
    if args.prompt_file is not None:
        try:
            with open(args.prompt_file, encoding="utf-8") as f:
                lines = f.read().splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"--prompt-file {args.prompt_file} is not UTF-8 text ({e.reason} "
                             f"at byte {e.start})") from None
        except OSError as e:
            raise ValueError(f"--prompt-file {args.prompt_file}: {e.strerror}") from None
        for n, line in enumerate(lines, 1):
            if not line:
                raise ValueError(f"--prompt-file {args.prompt_file}: line {n} is empty (one "
                                 "prompt per line)")
            prompts.append(line)
        if not lines:
            raise ValueError(f"--prompt-file {args.prompt_file} holds no prompt")
    return prompts or ["\n"]


def encode(tokenizer, text: str, i: int, n: int) -> list[int]:
    """The prompt's token ids; an error naming the prompt (when there are several)."""
    try:
        return tokenizer.encode(text)
    except ValueError as e:
        raise ValueError(f"prompt {i + 1}: {e}" if n > 1 else str(e)) from None


def write_batch(model: Generates, tokenizer, prompts: list[str], ids: list[list[int]],
                max_new_tokens: int, **options) -> None:
    """Decodes the prompts together, then prints each one's text under a header line (on
    Ctrl-C, the text so far)."""
    new: list[list[int]] = [[] for _ in prompts]
    try:
        for step in model.stream_batch(ids, max_new_tokens, **options):
            for row, t in zip(new, step.tolist()):
                row.append(t)
    finally:
        for i, (text, row) in enumerate(zip(prompts, new)):
            continuation = "".join(decode_stream(tokenizer, row))
            sys.stdout.write(f"=== prompt {i + 1} ===\n{text}{continuation}\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
    # Done and flushed: skip the interpreter's teardown, which with torch loaded costs about a
    # quarter of a second of the time a user waits for the command (errors and Ctrl-C leave
    # through SystemExit above, the usual way).
    with exits_cleanly():
        sys.stdout.flush()
    os._exit(0)
