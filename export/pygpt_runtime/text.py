"""The text side of a pygpt ONNX export, which pygpt shares: the tokenizers of tokenizer.json
(the `tokenizers` library only for bpe and wordpiece, imported when one is read), the special
tokens' encoding (pygpt.tokenizer's kinds subclass SpecialsEncoding), the streaming decoder of
token ids (TextStream, decode_stream: the runner, the server, python -m pygpt.generate), a
translator's source text cut before it is tokenized, a raw text's words as a WordPiece tokenizer
splits it (word_spans: what an entity tagger and a question answerer read), and the check that a
file of the export is there. It imports neither onnxruntime nor numpy, so that pygpt's training
and commands, which import it, load neither (onnx_text.py holds the graph runs).

Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK], for the BERT family) behave as in pygpt's
tokenizers: encode(text) treats a name written in text as plain text (HF's library matches the
names by default; here it is switched off), encode(text, parse_specials=True) gives their ids
(a fill-mask prompt "a [MASK] b"); encode never adds [CLS]/[SEP]; decode writes a special id as
its name."""
from __future__ import annotations

import codecs
import re
import unicodedata
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from pygpt_runtime.json_file import read_json

# A source is read up to this many characters per encoder position: a token covers a character
# or more (or a byte of one) in normal text, so what is cut off lies far past the positions.
CHARS_PER_POSITION = 32


def require_file(path: Path) -> None:
    """A FileNotFoundError naming path unless it is a file of the export."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the export folder is incomplete "
                                "(export again)")


def source_text(text: str, block_size: int) -> tuple[str, bool]:
    """text stripped, and cut to CHARS_PER_POSITION * block_size characters before it is
    tokenized (a huge line would cost memory for tokens the encoder never sees); and whether it
    was cut."""
    text = text.strip()
    most = CHARS_PER_POSITION * block_size
    return text[:most], len(text) > most


class SpecialsEncoding:
    """Encoding with or without matching the special names, for every kind (of this runner and of
    pygpt.tokenizer): a subclass gives `_encode_text` and calls `_set_specials`."""
    special_tokens: dict[str, int] = {}  # name -> id; empty without specials
    # A byte-level tokenizer's: the bytes an id stands for (its text is all of them as UTF-8).
    token_bytes: Optional[Callable[[int], bytes]] = None
    _pattern = None  # the special names, the longest first, as one captured alternation

    def _set_specials(self, special_tokens: dict[str, int]) -> None:
        self.special_tokens = dict(special_tokens)
        if special_tokens:
            longest_first = sorted(special_tokens, key=len, reverse=True)
            self._pattern = re.compile("(%s)" % "|".join(re.escape(n) for n in longest_first))

    def _encode_text(self, text: str) -> list[int]:
        raise NotImplementedError

    def id_bound(self) -> int:
        """One more than the largest id encode can give (check_ids)."""
        raise NotImplementedError

    def encode(self, text: str, parse_specials: bool = False) -> list[int]:
        """The ids of text; with parse_specials, the special names in text give their ids."""
        if self._pattern is None or not parse_specials:
            return self._encode_text(text)
        ids: list[int] = []
        for n, part in enumerate(self._pattern.split(text)):  # names at the odd places
            ids.extend([self.special_tokens[part]] if n % 2 else self._encode_text(part))
        return ids


class CharTokenizer(SpecialsEncoding):
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

    def id_bound(self) -> int:
        return len(self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)


class HFTokenizer(SpecialsEncoding):
    """A byte-level BPE or WordPiece tokenizer.json (HF format), through `tokenizers`."""

    def __init__(self, path: Path):
        try:  # only models with a bpe/wordpiece tokenizer need it
            from tokenizers import Tokenizer
        except ImportError:
            raise ImportError(f"{path} is a bpe/wordpiece tokenizer, which the runner reads with "
                              "HF tokenizers: pip install tokenizers") from None
        require_file(path)
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises its own error type for a damaged file
            raise ValueError(f"{path} is not a tokenizer tokenizers can read: {e}") from None
        self._tok.encode_special_tokens = True  # names in text are text, as in pygpt
        added = self._tok.get_added_tokens_decoder()
        self._set_specials({added[i].content: i for i in sorted(added) if added[i].special})
        self.token_bytes = byte_level_bytes(self._tok)

    def _encode_text(self, text: str) -> list[int]:
        try:
            return self._tok.encode(text, add_special_tokens=False).ids
        except Exception as e:  # tokenizers' own error type: a model it cannot encode with
            raise ValueError(f"the tokenizer cannot encode the text ({e}): export again") from None

    def __len__(self) -> int:
        return self._tok.get_vocab_size()

    def id_bound(self) -> int:
        return hf_id_bound(self._tok)

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def hf_id_bound(tok) -> int:
    """One more than the largest id of a `tokenizers.Tokenizer` (its vocabulary's and its added
    tokens'). Its get_vocab_size counts the tokens instead, which is less where ids are skipped
    (a vocabulary {"a": 0, "b": 9} has 2 tokens, the id 9 among them)."""
    return max(tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1


def check_ids(tokenizer: SpecialsEncoding, vocab_size: int, source: object) -> None:
    """A ValueError naming source (the tokenizer's file) unless every id tokenizer can give is
    below vocab_size, the rows of the model's embedding and logits: a tokenizer of as many tokens
    whose ids skip some gives a larger one, which no model input can take."""
    bound = tokenizer.id_bound()
    if bound > vocab_size:
        raise ValueError(f"{source} maps a token to the id {bound - 1}, past the model's "
                         f"{vocab_size} tokens (ids 0 to {vocab_size - 1}): a tokenizer of "
                         "another model, or a damaged one")


def load_tokenizer(path: Path, kind: str, vocab_size: Optional[int] = None):
    """The export's tokenizer, of vocab_size tokens when given (the model's); a missing or
    damaged file is a one-line error naming it."""
    if kind == "char":
        require_file(path)
        try:
            spec = read_json(path, "a tokenizer file")
        except ValueError as e:
            raise ValueError(f"{e}: export again") from None
        try:
            chars, specials = spec["chars"], spec.get("specials", [])
            if not all(isinstance(x, list) and all(isinstance(c, str) for c in x)
                       for x in (chars, specials)):
                raise TypeError("chars and specials must be lists of strings")
            tokenizer = CharTokenizer(chars, specials)
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path} is damaged ({e!r}): export again") from None
    elif kind in ("bpe", "wordpiece"):
        tokenizer = HFTokenizer(path)
    else:
        raise ValueError(f"{path}: unsupported tokenizer kind {kind!r}")
    if vocab_size is not None and len(tokenizer) != vocab_size:
        raise ValueError(f"{path} has {len(tokenizer)} tokens but the model {vocab_size}: "
                         "files of different exports (export again)")
    if vocab_size is not None:
        check_ids(tokenizer, vocab_size, path)
    return tokenizer


def _byte_of_char() -> dict[str, int]:
    """The byte each character of the byte-level (GPT-2) alphabet stands for: the printable
    Latin-1 bytes for themselves, the others for chr(256), chr(257), ... in byte order."""
    chars = {b: chr(b) for b in (*range(33, 127), *range(161, 173), *range(174, 256))}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return {c: b for b, c in chars.items()}


_BYTE_OF_CHAR = _byte_of_char()


def byte_level_bytes(tok) -> Optional[Callable[[int], bytes]]:
    """For a `tokenizers.Tokenizer` with a byte-level decoder, id -> the bytes it decodes to, as
    that decoder does: a token of alphabet characters is their bytes, any other (a special
    name such as "[PAD]") its UTF-8; an unknown id none. decode(ids) is then all their bytes
    read as UTF-8, each invalid part a U+FFFD. None for any other tokenizer."""
    from tokenizers import decoders

    if not isinstance(tok.decoder, decoders.ByteLevel):
        return None

    def token_bytes(i: int) -> bytes:
        token = tok.id_to_token(i)
        if token is None:
            return b""
        try:
            return bytes(_BYTE_OF_CHAR[c] for c in token)
        except KeyError:
            return token.encode("utf-8")
    return token_bytes


class TextStream:
    """The text of token ids given one at a time (`add`), piece by piece as it becomes whole, in
    time linear in the ids; the pieces, with `finish`'s, join to decode(all the ids). A
    byte-level BPE's bytes are read as UTF-8 as they come: only the bytes of a character not
    complete yet (at most 3) are held back, bytes that cannot begin or continue a character give
    a U+FFFD at once, and a stream ending inside a character gives it as a U+FFFD. Any other
    tokenizer's new id is decoded after the ids of the piece given last, and the piece is what
    that adds to their text: a wordpiece token's leading space or "##" depends on the token
    before it."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.utf8 = (codecs.getincrementaldecoder("utf-8")("replace")
                     if tokenizer.token_bytes is not None else None)
        self.window: list[int] = []  # the ids of the piece given last, then those not given yet
        self.given, self.prefix = 0, ""  # how many of window were given; their text

    def _new_part(self, text: str) -> str:
        if text.startswith(self.prefix):
            return text[len(self.prefix):]
        return self.tokenizer.decode(self.window[self.given:])

    def add(self, i: int) -> str:
        """The text that id i completes ("" while none is whole)."""
        if self.utf8 is not None:
            return self.utf8.decode(self.tokenizer.token_bytes(int(i)))
        self.window.append(int(i))
        text = self.tokenizer.decode(self.window)
        if len(text) <= len(self.prefix):
            return ""
        piece = self._new_part(text)
        self.window = self.window[self.given:]
        self.given, self.prefix = len(self.window), self.tokenizer.decode(self.window)
        return piece

    def finish(self) -> str:
        """The text held back at the end of the stream."""
        if self.utf8 is not None:
            return self.utf8.decode(b"", final=True)
        if len(self.window) > self.given:
            return self._new_part(self.tokenizer.decode(self.window))
        return ""


def decode_stream(tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """The text of a stream of token ids, piece by piece as it becomes whole (TextStream)."""
    text = TextStream(tokenizer)
    for i in ids:
        if piece := text.add(i):
            yield piece
    if rest := text.finish():
        yield rest


def _is_punctuation(c: str) -> bool:
    """BERT's rule (its BasicTokenizer, and the tokenizers library's BertPreTokenizer): every
    ASCII character that is not a letter, digit or space, and Unicode's punctuation (P*)."""
    return ((33 <= ord(c) <= 47 or 58 <= ord(c) <= 64 or 91 <= ord(c) <= 96
             or 123 <= ord(c) <= 126) or unicodedata.category(c).startswith("P"))


def word_spans(text: str) -> list[tuple[int, int]]:
    """The words of a raw text as character spans [start, end):
    split at whitespace and around each punctuation character (one word each), as a WordPiece
    tokenizer splits before it looks up pieces (and as CoNLL files hold words)."""
    spans: list[tuple[int, int]] = []
    start: Optional[int] = None
    for i, c in enumerate(text):
        if c.isspace() or _is_punctuation(c):
            if start is not None:
                spans.append((start, i))
                start = None
            if not c.isspace():
                spans.append((i, i + 1))
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    return spans
