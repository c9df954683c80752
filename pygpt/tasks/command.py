"""What the commands that run a fine-tuned BERT head over texts or a file share (classify, tag,
answer): the start of their command line and the frame their work runs in, so that each command
holds only its own inputs and outputs."""
from __future__ import annotations

import argparse
import contextlib
from typing import Iterator

from pygpt.config.flags import add_model_flags
from pygpt.mixed_precision import autocast
from pygpt_runtime.cli_checks import HelpFormatter, exits_cleanly


def task_parser(command: str, doc: str, ckpt_help: str, unit: str) -> argparse.ArgumentParser:
    """`python -m pygpt.<command>`'s parser with the flags every such command takes: --ckpt (the
    fine-tuned model's folder), --batch-size (64 `unit` a forward pass; task_run checks it), and
    the model's --kernels and --dtype."""
    p = argparse.ArgumentParser(prog=f"python -m pygpt.{command}", description=doc,
                                formatter_class=HelpFormatter)
    p.add_argument("--ckpt", default="out", help=ckpt_help)
    p.add_argument("--batch-size", type=int, default=64, help=f"{unit} per forward pass")
    add_model_flags(p)
    return p


@contextlib.contextmanager
def task_run(args: argparse.Namespace) -> Iterator[None]:
    """The frame of such a command's work: --batch-size checked, the model computing under
    --dtype's autocast, bad input (a ValueError, a missing file) a one-line error, and Ctrl-C or
    a closed pipe (`| head`) an end without a traceback."""
    with exits_cleanly(), autocast("cpu", args.dtype):
        try:
            if args.batch_size < 1:
                raise ValueError("--batch-size must be at least 1")
            yield
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"error: {e}") from None
