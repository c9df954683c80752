"""What pygpt's command lines share: flags generated from the config dataclasses (so every field is
overridable and documented in --help without a second list of options to keep in step), the
--help formatter, the UTF-8 check of text arguments, and the clean exit on Ctrl-C or a closed
pipe."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import typing
from typing import Any, Iterator


def _field_type(cls: type, f: dataclasses.Field) -> Any:
    hint = typing.get_type_hints(cls)[f.name]
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
