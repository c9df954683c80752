"""The character tokenizer: one token per distinct character of the training text, in sorted
order. Saved as tokenizer.json beside the checkpoint (and read by the ONNX runner)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Union

from pygpt.io import atomic_write_text


class CharTokenizer:
    kind = "char"

    def __init__(self, chars: list[str]):
        if not chars or len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("a char tokenizer needs a non-empty list of distinct single characters")
        self.chars = list(chars)
        self._index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: str) -> "CharTokenizer":
        if not text:
            raise ValueError("cannot build a tokenizer from empty text")
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of text that have no token, in order of appearance."""
        return list(dict.fromkeys(c for c in text if c not in self._index))

    def encode(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            shown = " ".join(repr(c) for c in missing[:20]) + (" ..." if len(missing) > 20 else "")
            raise ValueError(f"{len(missing)} character(s) not in the tokenizer's vocabulary: "
                             f"{shown}. The model only knows the {self.vocab_size} characters "
                             "of its training text.")
        return [self._index[c] for c in text]

    def decode(self, ids) -> str:
        try:
            return "".join(self.chars[int(i)] for i in ids)
        except IndexError as e:
            raise ValueError(f"token id out of range for a vocabulary of {self.vocab_size}") from e

    def to_dict(self) -> dict:
        return {"kind": self.kind, "chars": self.chars}

    def save(self, path: Union[str, Path]) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), ensure_ascii=False))


def load_tokenizer(path: Union[str, Path]) -> CharTokenizer:
    path = Path(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no tokenizer at {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not a valid tokenizer file: {e}") from None
    if not isinstance(spec, dict) or spec.get("kind") != "char" or "chars" not in spec:
        raise ValueError(f"{path}: unsupported tokenizer (expected kind 'char' with 'chars')")
    return CharTokenizer(spec["chars"])
