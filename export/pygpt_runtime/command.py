"""The pygpt-run command (`python -m pygpt_runtime`): one entry for every exported family. It
reads the --model folder's runner.json and hands the whole command line to the translator's
runner (onnx_seq2seq.py) for a seq2seq export, to run_onnx.py (gpt, bert) otherwise, which
also reports a missing or damaged export."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from pygpt_runtime import onnx_seq2seq, run_onnx
from pygpt_runtime.runner_config import read_config

TRANSLATOR_FAMILY = "seq2seq"  # runner.json's "family" of an exported encoder-decoder


def export_family(argv: Optional[list[str]]) -> Optional[str]:
    """The family of the export that argv's --model names; None without a readable one."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--model", default=None)
    model = peek.parse_known_args(argv)[0].model
    if model is None:
        return None
    try:
        return read_config(Path(model))["family"]
    except (ValueError, OSError):
        return None


def main(argv: Optional[list[str]] = None) -> None:
    if export_family(argv) == TRANSLATOR_FAMILY:
        onnx_seq2seq.main(argv)
    else:
        run_onnx.main(argv)
