"""Tokenizers, saved as tokenizer.json beside the checkpoint (and read by the ONNX runner).

- `char` (the default): one token per distinct character of the training text, in sorted order;
  a text with a character it lacks is refused with the list of them.
- `bpe`: byte-level BPE trained on the training text with HF `tokenizers`; it starts from the 256
  byte values, so any text encodes (no unknown characters). Its tokenizer.json is the HF format.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Iterator, Union

from pygpt.io import atomic_write_text


class CharTokenizer:
    kind = "char"

    def __init__(self, chars: list[str]):
        if not chars or len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("a char tokenizer needs a non-empty list of distinct single characters")
        self.chars = list(chars)
        self._index = {c: i for i, c in enumerate(self.chars)}

    @classmethod
    def from_text(cls, text: Union[str, Iterable[str]]) -> "CharTokenizer":
        """From a text, or an iterable of text chunks (a file read piece by piece)."""
        chars: set[str] = set()
        for chunk in [text] if isinstance(text, str) else text:
            chars.update(chunk)
        if not chars:
            raise ValueError("cannot build a tokenizer from empty text")
        return cls(sorted(chars))

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

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "chars": self.chars}, ensure_ascii=False)

    def save(self, path: Union[str, Path]) -> None:
        atomic_write_text(path, self.to_json())


class BPETokenizer:
    kind = "bpe"

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer  # a tokenizers.Tokenizer

    @classmethod
    def train(cls, text: Union[str, Iterable[str]], vocab_size: int) -> "BPETokenizer":
        """Byte-level BPE with vocab_size tokens (at least the 256 bytes) learned from text."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if vocab_size < 257:
            raise ValueError(f"a byte-level BPE needs --vocab-size above 256, got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator([text] if isinstance(text, str) else text, trainer)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])

    def to_json(self) -> str:
        return self._tok.to_str()

    def save(self, path: Union[str, Path]) -> None:
        atomic_write_text(path, self.to_json())


Tokenizer = Union[CharTokenizer, BPETokenizer]


def load_tokenizer(path: Union[str, Path]) -> Tokenizer:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no tokenizer at {path}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not a valid tokenizer file: {e}") from None
    return tokenizer_from_json(text, str(path))


def tokenizer_from_json(text: str, source: str = "tokenizer") -> Tokenizer:
    """A tokenizer from the text of its tokenizer.json; `source` names it in errors."""
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source} is not a valid tokenizer file: {e}") from None
    if isinstance(spec, dict) and spec.get("kind") == "char" and "chars" in spec:
        try:
            return CharTokenizer(spec["chars"])
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source} is not a valid char tokenizer: {e}") from None
    if isinstance(spec, dict) and isinstance(spec.get("model"), dict) and spec["model"].get("type") == "BPE":
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return BPETokenizer(HFTokenizer.from_str(text))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # tokenizers reports some damage as a Rust panic, which
            # reaches Python as a BaseException (pyo3's PanicException)
            raise ValueError(f"{source} is not a valid BPE tokenizer: {e}") from None
    raise ValueError(f"{source}: unsupported tokenizer (expected kind 'char', or an HF BPE tokenizer)")


def decode_stream(tokenizer: Tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """The text of a stream of token ids, piece by piece as it becomes whole: a byte-level token
    can end in the middle of a multi-byte character, which is held back until it completes."""
    pending: list[int] = []
    for i in ids:
        pending.append(int(i))
        text = tokenizer.decode(pending)
        if not text.endswith("\ufffd"):
            yield text
            pending = []
    if pending:
        yield tokenizer.decode(pending)
