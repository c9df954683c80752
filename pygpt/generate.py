"""Sample text from a checkpoint, streaming it as it is generated:

    python -m pygpt.generate --ckpt out/ --prompt "ROMEO:" --max-new-tokens 500

Ctrl-C stops it (exit status 130) with the text so far printed."""
from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch

from pygpt.checkpoint import load
from pygpt.cli import HelpFormatter, exits_cleanly, utf8_text
from pygpt.config import KERNEL_SETS
from pygpt.decoding import Generates, Sampling
from pygpt.tokenizer import decode_stream

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
