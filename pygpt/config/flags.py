"""Flags generated from the config dataclasses, so every field is overridable and documented in
--help without a second list of options to keep in step. (What every command line shares with
the torch-free runner, the --help formatter, the UTF-8 check of text arguments and the clean
exit on Ctrl-C or a closed pipe, is pygpt_runtime.cli_checks.)"""
from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Optional

from pygpt.config.training import DTYPES, KERNEL_SETS
from pygpt_runtime.cli_checks import check_threads


def _whole_numbers(text: str) -> tuple[int, ...]:
    """A flag's comma-separated whole numbers ("3,2,4"; "" for none)."""
    try:
        return tuple(int(part) for part in text.split(",")) if text.strip() else ()
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}"
                                         ) from None


def _field_type(cls: type, f: dataclasses.Field) -> Any:
    hint = typing.get_type_hints(cls)[f.name]
    if typing.get_origin(hint) is tuple:
        return _whole_numbers, None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return str, list(typing.get_args(hint))
    if args and typing.get_origin(args[0]) is typing.Literal:
        return str, list(typing.get_args(args[0]))
    return (args[0] if args else hint), None


def add_dataclass_flags(parser: argparse.ArgumentParser, cls: type, title: str,
                        skip: tuple[str, ...] = ()) -> None:
    """One --flag per field of cls (but those in skip); defaults are SUPPRESSed so only flags
    given explicitly appear in the parsed namespace (presets and checkpoints supply the rest)."""
    group = parser.add_argument_group(title)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        kind, choices = _field_type(cls, f)
        flag = "--" + f.name.replace("_", "-")
        doc = f.metadata.get("help", "")
        if kind is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=doc)
        else:
            group.add_argument(flag, dest=f.name, type=kind, choices=choices,
                               default=argparse.SUPPRESS, metavar=None if choices else f.name.upper(),
                               help=doc)


def overrides(namespace: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of cls that were given on the command line."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(namespace).items() if k in names}


def use_threads(threads: Optional[int]) -> None:
    """A command's --threads: checked (a one-line ValueError), then torch's intra-op threads
    (None: torch's choice)."""
    check_threads(threads)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """A command's flags for the model it runs: --kernels (our kernels or plain PyTorch ops) and
    --dtype (float32, or autocast to a low type: pygpt.mixed_precision)."""
    parser.add_argument("--kernels", choices=KERNEL_SETS, default="ext",
                        help="our C++ kernels, or plain PyTorch ops")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="number type of the matrix products: bfloat16 or float16 run "
                             "under autocast (the weights stay float32)")
