"""Tokenizers, saved as tokenizer.json beside the checkpoint (and read by the ONNX runner).

- `char` (the default): one token per distinct character of the training text, in sorted order;
  a text with a character it lacks is refused with the list of them.
- `bpe`: byte-level BPE trained on the training text with HF `tokenizers`; it starts from the 256
  byte values, so any text encodes (no unknown characters). Its tokenizer.json is the HF format.
- `wordpiece`: BERT's WordPiece, trained with HF `tokenizers` (HF format too). Any text encodes:
  a word with a character outside the vocabulary becomes one [UNK].

Special tokens (SPECIAL_TOKENS, for the BERT family): a wordpiece tokenizer always has them, at
ids 0..4; char (`from_text(..., specials=True)`, ids after the characters, which keep theirs) and
bpe (`train(..., specials=True)`, ids 0..4 before the bytes) have them, or other names given
instead of True (SEQ2SEQ_SPECIALS, [PAD] [UNK] [BOS] [EOS], for a translator), on request.
`tokenizer.special_tokens` maps name -> id, empty without them. The same rules for every kind:
- `encode(text)` never gives a special id: a text containing "[MASK]" is encoded as those
  characters (HF's library matches the names in text by default; here it is switched off).
  `encode(text, parse_specials=True)` does match the names (a fill-mask prompt "a [MASK] b").
  `encode` never adds [CLS]/[SEP] around the text either: the caller adds them by id.
- `decode(ids)` writes a special id as its name, "[MASK]": inline for char and bpe, separated by
  spaces like every word for wordpiece (whose decode also joins "##" pieces to their word).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence, Union

from pygpt.storage.atomic import atomic_write_text
from pygpt.tokenizer.training import TextOrChunks, text_chunks, train_bpe, train_wordpiece
from pygpt_runtime.json_file import parse_json
from pygpt_runtime.text import SpecialsEncoding, byte_level_bytes, hf_id_bound

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# A translator's joint source/target vocabulary: padding, and the target's start and end.
SEQ2SEQ_SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")
Specials = Union[bool, Sequence[str]]  # True: SPECIAL_TOKENS; False: none; or the names


def special_names(specials: Specials) -> tuple[str, ...]:
    """The special token names a `specials` argument asks for."""
    if isinstance(specials, bool):
        return SPECIAL_TOKENS if specials else ()
    return tuple(specials)


def require_specials(special_tokens: dict[str, int], names: Sequence[str], need: str) -> None:
    """A ValueError unless special_tokens has every one of names (those `need` writes)."""
    missing = [name for name in names if name not in special_tokens]
    if missing:
        has = "a BERT's" if set(names) <= set(SPECIAL_TOKENS) else "a translator's"
        raise ValueError(f"the tokenizer has no {', '.join(missing)} token(s): {need} need "
                         f"{', '.join(names)} ({has} tokenizer has them)")


class _Base(SpecialsEncoding):
    """What every kind shares: its special tokens and encoding with or without their names (the
    runner's SpecialsEncoding, one home for both), and saving."""
    kind = ""
    encoding_needs: tuple[str, ...] = ()  # the special tokens it needs to encode any text

    def to_json(self) -> str:
        raise NotImplementedError

    def save(self, path: Union[str, Path]) -> None:
        atomic_write_text(path, self.to_json())


class CharTokenizer(_Base):
    kind = "char"

    def __init__(self, chars: list[str], specials: Sequence[str] = ()):
        if not chars or len(set(chars)) != len(chars) or any(len(c) != 1 for c in chars):
            raise ValueError("a char tokenizer needs a non-empty list of distinct single characters")
        specials = list(specials)
        if len(set(specials)) != len(specials) or any(not isinstance(s, str) or len(s) < 2
                                                      for s in specials):
            raise ValueError("a char tokenizer's specials must be distinct names of 2+ characters")
        self.chars, self.specials = list(chars), specials
        self._pieces = self.chars + specials  # the text of each id
        self._index = {c: i for i, c in enumerate(self.chars)}
        self._set_specials({s: len(self.chars) + i for i, s in enumerate(specials)})

    @classmethod
    def from_text(cls, text: TextOrChunks, specials: Specials = False) -> "CharTokenizer":
        """From a text, or an iterable of text chunks. With specials (True: SPECIAL_TOKENS, or
        the names) they follow the characters (ids len(chars)..): the characters' ids are those
        without."""
        chars: set[str] = set()
        for chunk in text_chunks(text):
            chars.update(chunk)
        if not chars:
            raise ValueError("cannot build a tokenizer from empty text")
        return cls(sorted(chars), special_names(specials))

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    def id_bound(self) -> int:
        return len(self._pieces)

    def unknown(self, text: str) -> list[str]:
        """The distinct characters of text that have no token, in order of appearance."""
        return list(dict.fromkeys(c for c in text if c not in self._index))

    def _encode_text(self, text: str) -> list[int]:
        missing = self.unknown(text)
        if missing:
            shown = " ".join(repr(c) for c in missing[:20]) + (" ..." if len(missing) > 20 else "")
            raise ValueError(f"{len(missing)} character(s) not in the tokenizer's vocabulary: "
                             f"{shown}. The model only knows the {len(self.chars)} characters "
                             "of its training text.")
        return [self._index[c] for c in text]

    def decode(self, ids) -> str:
        try:
            return "".join(self._pieces[int(i)] for i in ids)
        except IndexError as e:
            raise ValueError(f"token id out of range for a vocabulary of {self.vocab_size}") from e

    def to_json(self) -> str:
        spec = {"kind": self.kind, "chars": self.chars}
        if self.specials:  # without, the file is what it was before specials existed
            spec["specials"] = self.specials
        return json.dumps(spec, ensure_ascii=False)


class _HFTokenizer(_Base):
    """What the kinds built on an HF `tokenizers.Tokenizer` share; its tokenizer.json is HF's."""
    hf_type = ""  # the model type in HF's tokenizer.json

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer  # a tokenizers.Tokenizer
        # Special names written in a text are encoded as text (not saved in the json: HF's own
        # readers of the file, such as the ONNX runner, must set this themselves).
        tokenizer.encode_special_tokens = True
        self._set_specials({t.content: i for i, t in
                            sorted(tokenizer.get_added_tokens_decoder().items()) if t.special})
        self.token_bytes = byte_level_bytes(tokenizer)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def id_bound(self) -> int:
        return hf_id_bound(self._tok)

    def _encode_text(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return self._tok.to_str()


class BPETokenizer(_HFTokenizer):
    kind, hf_type = "bpe", "BPE"

    @classmethod
    def train(cls, text: TextOrChunks, vocab_size: int,
              specials: Specials = False) -> "BPETokenizer":
        """Byte-level BPE with vocab_size tokens (at least the 256 bytes) learned from text. With
        specials (True: SPECIAL_TOKENS, or the names) they take the first ids (and count in
        vocab_size): the bytes follow them."""
        return cls(train_bpe(text, vocab_size, special_names(specials)))


class WordPieceTokenizer(_HFTokenizer):
    kind, hf_type = "wordpiece", "WordPiece"
    encoding_needs = ("[UNK]",)  # it spells a word it cannot split as [UNK]

    @classmethod
    def train(cls, text: TextOrChunks, vocab_size: int,
              lowercase: bool = False) -> "WordPieceTokenizer":
        """BERT's WordPiece with vocab_size tokens learned from text (or its chunks): SPECIAL_TOKENS
        at ids 0..4, the text's characters (sorted) and the "##" forms of those seen inside a
        word (sorted), then the learned pieces. BERT's normalizer keeps case unless lowercase
        (which also strips accents, as BERT uncased does); it drops control characters, makes any
        whitespace a space and sets each CJK character apart as a word. A word the vocabulary
        cannot spell becomes one [UNK]: one with a character outside it, or with one never seen
        inside a word in training (no "##" form), or of over 100 characters. decode joins words
        with single spaces and "##" pieces to their word (. , ! ? against the word before); what
        it gives encodes to the same ids again. A vocab_size below the specials and that alphabet
        is refused. Deterministic: HF's trainer gets the alphabet in that order (by itself it
        numbers the "##" forms in a per-process hash map's order, and ties between merges go by
        id: huggingface/tokenizers#1794) and learns from the words counted here. Both kinds learn
        from a word of over MAX_TRAINING_WORD characters as from its pieces of that length
        (pygpt.tokenizer.training)."""
        return cls(train_wordpiece(text, vocab_size, lowercase, SPECIAL_TOKENS))


Tokenizer = Union[CharTokenizer, BPETokenizer, WordPieceTokenizer]
_HF_KINDS = {cls.hf_type: cls for cls in (BPETokenizer, WordPieceTokenizer)}


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
    spec = parse_json(text, source, "a valid tokenizer file")
    if isinstance(spec, dict) and spec.get("kind") == "char" and "chars" in spec:
        try:
            return CharTokenizer(spec["chars"], spec.get("specials", ()))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{source} is not a valid char tokenizer: {e}") from None
    model = spec.get("model") if isinstance(spec, dict) else None
    kind = model.get("type") if isinstance(model, dict) else None
    hf_class = _HF_KINDS.get(kind) if isinstance(kind, str) else None
    if hf_class is not None:
        from tokenizers import Tokenizer as HFTokenizer

        try:
            return hf_class(HFTokenizer.from_str(text))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # tokenizers reports some damage as a Rust panic, which
            # reaches Python as a BaseException (pyo3's PanicException)
            raise ValueError(f"{source} is not a valid {hf_class.hf_type} tokenizer: {e}") from None
    raise ValueError(f"{source}: unsupported tokenizer (expected kind 'char', or an HF BPE or "
                     "WordPiece tokenizer)")
