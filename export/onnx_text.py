"""The tokenizers of a pygpt ONNX export (tokenizer.json), and opening the export folder, with
numpy and onnxruntime only (the `tokenizers` library only for bpe and wordpiece): part of the
deployment side, beside run_onnx.py.

Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK], for the BERT family) behave as in pygpt's
tokenizers: encode(text) treats a name written in text as plain text (HF's library matches the
names by default; here it is switched off), encode(text, parse_specials=True) gives their ids
(a fill-mask prompt "a [MASK] b"); encode never adds [CLS]/[SEP]; decode writes a special id as
its name."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator, Optional

import onnxruntime as ort

RUNNER_CONFIG = "runner.json"  # the export's config (pygpt.run_files names it; no pygpt here)


def read_config(folder: Path) -> dict:
    """An export folder's runner.json; its "family" is "gpt" in exports made before BERT's."""
    config_path = folder / RUNNER_CONFIG
    if not config_path.exists():
        raise FileNotFoundError(f"{folder} has no {RUNNER_CONFIG}: not a pygpt ONNX "
                                "export (or one made before it was named so: export again)")
    return {"family": "gpt", **json.loads(config_path.read_text(encoding="utf-8"))}


def open_export(folder: Path, variant: str = "fp32", threads: Optional[int] = None):
    """(runner config, onnxruntime session, tokenizer) of an export folder."""
    config = read_config(folder)
    if variant not in config["models"]:
        raise ValueError(f"no {variant} model in {folder} (has: {', '.join(config['models'])})")
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(folder / config["models"][variant]), options,
                                   providers=["CPUExecutionProvider"])
    tokenizer = load_tokenizer(folder / config["tokenizer"]["file"], config["tokenizer"]["kind"])
    return config, session, tokenizer


class _Specials:
    """Encoding with or without matching the special names, for every kind."""
    special_tokens: dict[str, int] = {}
    _pattern = None  # the special names, the longest first, as one captured alternation

    def _set_specials(self, special_tokens: dict[str, int]) -> None:
        self.special_tokens = dict(special_tokens)
        if special_tokens:
            longest_first = sorted(special_tokens, key=len, reverse=True)
            self._pattern = re.compile("(%s)" % "|".join(re.escape(n) for n in longest_first))

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str, parse_specials: bool = False) -> list[int]:
        if self._pattern is None or not parse_specials:
            return self._encode_text(text)
        ids: list[int] = []
        for n, part in enumerate(self._pattern.split(text)):  # names at the odd places
            ids.extend([self.special_tokens[part]] if n % 2 else self._encode_text(part))
        return ids


class CharTokenizer(_Specials):
    """The character tokenizer of pygpt (tokenizer.json with kind 'char'); its special tokens
    follow the characters."""

    def __init__(self, chars: list[str], specials: list[str] = ()):
        self.pieces = list(chars) + list(specials)
        self.index = {c: i for i, c in enumerate(chars)}
        self._set_specials({s: len(chars) + i for i, s in enumerate(specials)})

    def _encode_text(self, text: str) -> list[int]:
        missing = list(dict.fromkeys(c for c in text if c not in self.index))
        if missing:
            raise ValueError(f"{len(missing)} character(s) not in the model's vocabulary: "
                             + " ".join(repr(c) for c in missing[:20]))
        return [self.index[c] for c in text]

    def decode(self, ids) -> str:
        return "".join(self.pieces[int(i)] for i in ids)


class HFTokenizer(_Specials):
    """A byte-level BPE or WordPiece tokenizer.json (HF format), through `tokenizers`."""

    def __init__(self, path: Path):
        from tokenizers import Tokenizer  # only models with a bpe/wordpiece tokenizer need it

        self._tok = Tokenizer.from_file(str(path))
        self._tok.encode_special_tokens = True  # names in text are text, as in pygpt
        added = self._tok.get_added_tokens_decoder()
        self._set_specials({added[i].content: i for i in sorted(added) if added[i].special})

    def _encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def load_tokenizer(path: Path, kind: str):
    if kind == "char":
        spec = json.loads(path.read_text(encoding="utf-8"))
        return CharTokenizer(spec["chars"], spec.get("specials", []))
    if kind in ("bpe", "wordpiece"):
        return HFTokenizer(path)
    raise ValueError(f"{path}: unsupported tokenizer kind {kind!r}")


def decode_stream(tokenizer, ids) -> Iterator[str]:
    """Text pieces as they become whole (a byte-level token can end inside a character)."""
    pending: list[int] = []
    for i in ids:
        pending.append(int(i))
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):
            yield text
            pending = []
    if pending:
        yield tokenizer.decode(pending)
