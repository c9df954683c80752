"""The pygpt-run command (`python -m pygpt_runtime`): one entry for every exported family. It
reads the --model folder's runner.json and hands the whole command line to the entry of the
family it names (families.py: run_onnx.py for a gpt, onnx_bert.py for a bert, onnx_seq2seq.py
for a translator); without a readable one, to the default family's, which reports a missing or
damaged export. Only the runner of that family is imported."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from pygpt_runtime.families import DEFAULT, FAMILIES, load
from pygpt_runtime.runner_config import read_family


def export_family(argv: Optional[list[str]]) -> Optional[str]:
    """The family of the export that argv's --model names; None without one that names a
    family (its entry checks the rest of its runner.json)."""
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--model", default=None)
    model = peek.parse_known_args(argv)[0].model
    if model is None:
        return None
    try:
        return read_family(Path(model))
    except (ValueError, OSError):
        return None


def main(argv: Optional[list[str]] = None) -> None:
    load(FAMILIES[export_family(argv) or DEFAULT].main)(argv)
