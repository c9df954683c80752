"""The byte-level BPE tokenizer (pygpt.tokenizer.BPETokenizer), load_tokenizer and decode_stream:
vocabulary size, lossless round trips of any Unicode text (also characters never seen in
training), the HF tokenizer.json format, streaming decode that only ever emits whole characters,
and clear errors for bad sizes and bad files."""

import json
import random

import pytest

from pygpt.data.text import SHIPPED_TEXT
from pygpt.tokenizer import BPETokenizer, CharTokenizer, load_tokenizer
from pygpt_runtime.text import decode_stream

# Characters the Shakespeare training text below never contains: emoji (4-byte UTF-8, also a ZWJ
# sequence and a flag), CJK, combining marks, RTL scripts, controls, the replacement character
# itself, a BOM and a character from the supplementary planes.
UNSEEN = [
    "😀",
    "👨\u200d👩\u200d👧",  # family: three emoji joined by zero-width joiners
    "🇫🇷",
    "世界你好",
    "こんにちは",
    "e\u0301 a\u0308\u0323 ñ",  # combining acute, diaeresis + dot below
    "Zürich façade naïve",
    "שלום مرحبا",
    "\x00\x01\x7f\t\r\n\x0b\x0c",
    "\ufffd",
    "\ufeffBOM",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \U0010FFFF",
    "  leading and trailing spaces  ",
    "\n\n\n",
    "",
]


@pytest.fixture(scope="module")
def corpus():
    """A few KB of Shakespeare: ASCII only."""
    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:6000]
    assert text.isascii()
    return text


@pytest.fixture(scope="module")
def bpe(corpus):
    return BPETokenizer.train(corpus, 300)


def bytes_to_unicode():
    """GPT-2's map from byte values to the printable characters that byte-level BPE uses as the
    names of its 256 base tokens (written out here so the test does not trust the code it tests)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars)))


def byte_token_ids(tokenizer: BPETokenizer, text: str) -> list[int]:
    """The ids of text's UTF-8 bytes as single-byte tokens (no merges): the finest split a
    byte-level model can produce, with multi-byte characters cut into their bytes."""
    vocab = json.loads(tokenizer.to_json())["model"]["vocab"]
    names = bytes_to_unicode()
    return [vocab[names[b]] for b in text.encode("utf-8")]


def random_unicode(rng: random.Random, length: int) -> str:
    """Random Unicode scalar values (no surrogates: they cannot be UTF-8) from every plane that
    has characters, weighted towards the multi-byte ranges."""
    ranges = [(0x0, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF), (0x10000, 0x10FFFF),
              (0x300, 0x36F), (0x1F300, 0x1FAFF)]
    out = []
    for _ in range(length):
        lo, hi = rng.choice(ranges)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


# --- training and vocabulary ------------------------------------------------------------------

def test_train_gives_requested_vocab_size(bpe, corpus):
    assert bpe.vocab_size == 300
    assert bpe.kind == "bpe"
    # Merges were learned: the corpus takes clearly fewer tokens than bytes.
    assert len(bpe.encode(corpus)) < 0.8 * len(corpus.encode("utf-8"))
    assert max(bpe.encode(corpus)) < 300


def test_train_from_chunks_equals_train_from_string(corpus):
    """Training reads the file chunk by chunk (read_chunks); a text given whole or split at
    line breaks learns the same vocabulary."""
    lines = corpus.splitlines(keepends=True)
    chunks = ["".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    assert BPETokenizer.train(iter(chunks), 300).to_json() == BPETokenizer.train(corpus, 300).to_json()


@pytest.mark.parametrize("size", [256, 255, 100, 1, 0, -5])
def test_vocab_size_of_256_or_less_is_refused(corpus, size):
    with pytest.raises(ValueError, match=r"vocab-size above 256.*" + str(size)):
        BPETokenizer.train(corpus, size)


def test_smallest_vocab_is_the_byte_alphabet_plus_one(corpus):
    tok = BPETokenizer.train(corpus, 257)
    assert tok.vocab_size == 257
    assert tok.decode(tok.encode("any 😀 text")) == "any 😀 text"


# --- lossless round trips ---------------------------------------------------------------------

@pytest.mark.parametrize("text", UNSEEN, ids=lambda s: s.encode("unicode_escape").decode()[:24])
def test_round_trip_of_unseen_characters(bpe, text):
    ids = bpe.encode(text)
    assert all(isinstance(i, int) and 0 <= i < bpe.vocab_size for i in ids)
    assert bpe.decode(ids) == text


def test_round_trip_of_random_unicode(bpe, corpus):
    rng = random.Random(1234)
    for _ in range(300):
        text = random_unicode(rng, rng.randint(1, 40))
        assert bpe.decode(bpe.encode(text)) == text, ascii(text)
    # Mixed with the training text, where merges apply around the unknown characters.
    for _ in range(50):
        start = rng.randrange(len(corpus) - 200)
        text = corpus[start:start + 100] + random_unicode(rng, 10) + corpus[start + 100:start + 200]
        assert bpe.decode(bpe.encode(text)) == text, ascii(text)


def test_decode_accepts_tensors_and_numpy_ints(bpe):
    import numpy as np
    import torch

    ids = bpe.encode("Zürich 😀")
    assert bpe.decode(torch.tensor(ids)) == "Zürich 😀"
    assert bpe.decode(np.array(ids, dtype=np.uint16)) == "Zürich 😀"


# --- saving and loading -----------------------------------------------------------------------

def test_save_load_round_trip_gives_identical_ids(bpe, corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    assert not [p.name for p in tmp_path.iterdir() if p.name != "tokenizer.json"]  # no temp left

    loaded = load_tokenizer(path)
    assert isinstance(loaded, BPETokenizer)
    assert loaded.vocab_size == 300
    texts = [corpus, "".join(UNSEEN)] + UNSEEN
    for text in texts:
        assert loaded.encode(text) == bpe.encode(text)
        assert loaded.decode(bpe.encode(text)) == text
    assert loaded.to_json() == bpe.to_json()


def test_saved_file_is_hf_byte_level_bpe(bpe, tmp_path):
    """tokenizer.json is the HF format: the `tokenizers` library (as used by the ONNX runner,
    transformers and others) reads it directly and gets the same ids."""
    from tokenizers import Tokenizer

    path = tmp_path / "tokenizer.json"
    bpe.save(path)
    spec = json.loads(path.read_text(encoding="utf-8"))
    assert spec["model"]["type"] == "BPE"
    assert len(spec["model"]["vocab"]) == 300
    assert len(spec["model"]["merges"]) == 300 - 256
    assert spec["pre_tokenizer"]["type"] == "ByteLevel"
    assert spec["decoder"]["type"] == "ByteLevel"
    hf = Tokenizer.from_file(str(path))
    text = "To be, or not to be 😀 世界"
    assert hf.encode(text).ids == bpe.encode(text)
    assert hf.decode(bpe.encode(text)) == text


def test_char_tokenizer_save_load_round_trip(tmp_path):
    tok = CharTokenizer.from_text("héllo wörld ☃\n")
    tok.save(tmp_path / "t.json")
    loaded = load_tokenizer(tmp_path / "t.json")
    assert isinstance(loaded, CharTokenizer) and loaded.chars == tok.chars


@pytest.mark.parametrize("content, error, pattern", [
    (None, FileNotFoundError, r"no tokenizer at"),
    ("", ValueError, r"not a valid tokenizer file"),
    ('{"model": {"type": "BPE", "vo', ValueError, r"not a valid tokenizer file"),   # truncated
    (b"\xff\xfe\x00garbage", ValueError, r"not a valid tokenizer file"),           # not UTF-8
    ("[1, 2, 3]", ValueError, r"unsupported tokenizer"),
    ('"a string"', ValueError, r"unsupported tokenizer"),
    ('{"kind": "wordpiece", "vocab": {}}', ValueError, r"unsupported tokenizer"),
    ('{"model": {"type": "WordPiece", "vocab": {}}}', ValueError, r"not a valid WordPiece"),
    ('{"model": {"type": "Unigram", "vocab": []}}', ValueError, r"unsupported tokenizer"),
    ('{"model": {"type": []}}', ValueError, r"unsupported tokenizer"),  # a type not a string
    ('{"model": {"type": "BPE"}}', ValueError, r"not a valid BPE tokenizer"),
    ('{"model": {"type": "BPE", "vocab": 3, "merges": []}}', ValueError, r"not a valid BPE"),
])
def test_load_tokenizer_errors(tmp_path, content, error, pattern):
    """Missing, corrupt or foreign files: a FileNotFoundError or ValueError naming the file."""
    path = tmp_path / "tokenizer.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(error, match=pattern) as info:
        load_tokenizer(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content, pattern", [
    ('{"kind": "char", "chars": []}', r"non-empty list"),
    ('{"kind": "char", "chars": ["ab", "c"]}', r"single characters"),
    ('{"kind": "char", "chars": ["a", "a"]}', r"distinct"),
])
def test_load_bad_char_tokenizer(tmp_path, content, pattern):
    path = tmp_path / "tokenizer.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=pattern):
        load_tokenizer(path)


def test_corrupted_bpe_file_is_refused(bpe, tmp_path):
    """A real tokenizer.json damaged on disk: cut in half, or with merges that name tokens the
    vocabulary lacks."""
    path = tmp_path / "tokenizer.json"
    text = bpe.to_json()
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid tokenizer file"):
        load_tokenizer(path)
    spec = json.loads(text)
    spec["model"]["vocab"] = {k: v for k, v in spec["model"]["vocab"].items() if v < 256}
    path.write_text(json.dumps(spec), encoding="utf-8")
    # tokenizers reports this damage by a Rust panic (a BaseException in Python); callers must
    # still get the ValueError they handle.
    with pytest.raises(ValueError, match="not a valid BPE tokenizer") as info:
        load_tokenizer(path)
    assert str(path) in str(info.value)


# --- streaming decode -------------------------------------------------------------------------

STREAM_TEXTS = ["plain ascii", "😀", "Zürich 😀 世界", "e\u0301\u0323", "👨\u200d👩\u200d👧 🇫🇷",
                "𝔘𝔫𝔦 \U0010FFFF end", "mixed: Thou art 世界, O Romeo! 😀\n", "\ufffd in the text"]


@pytest.mark.parametrize("split", ["bytes", "merged"])
@pytest.mark.parametrize("text", STREAM_TEXTS, ids=lambda s: s.encode("unicode_escape").decode()[:24])
def test_decode_stream_yields_whole_characters(bpe, text, split):
    """Cut into single-byte tokens, every multi-byte character spans several tokens; the stream
    holds those back until the character is complete, so no piece has a replacement character
    (other than one the text really contains), and the pieces add up to the whole text."""
    ids = byte_token_ids(bpe, text) if split == "bytes" else bpe.encode(text)
    if split == "bytes":
        assert len(ids) == len(text.encode("utf-8"))
    pieces = list(decode_stream(bpe, iter(ids)))
    assert "".join(pieces) == bpe.decode(ids) == text
    assert all(pieces), "empty piece"
    if "\ufffd" not in text:
        assert not any("\ufffd" in p for p in pieces), pieces
    if split == "bytes" and text.isascii():
        assert pieces == list(text)  # nothing held back that is already whole


def test_decode_stream_each_multibyte_character_is_one_piece(bpe):
    text = "a😀b世c"
    pieces = list(decode_stream(bpe, byte_token_ids(bpe, text)))
    assert pieces == ["a", "😀", "b", "世", "c"]


def test_decode_stream_flushes_an_incomplete_tail(bpe):
    """A stream that stops inside a character (a generation cut at max tokens) still gives
    back what it has, instead of dropping it or raising."""
    ids = byte_token_ids(bpe, "ab😀")[:-1]
    pieces = list(decode_stream(bpe, ids))
    assert pieces[:2] == ["a", "b"] and len(pieces) == 3
    assert "\ufffd" in pieces[2]


def test_decode_stream_of_char_tokenizer_is_one_character_per_token():
    tok = CharTokenizer.from_text("héllo ☃")
    ids = tok.encode("☃ héllo")
    assert list(decode_stream(tok, ids)) == list("☃ héllo")


def test_decode_stream_of_random_generations_matches_decode(bpe):
    """Any token sequence (what a model may emit), decoded as a stream, gives decode(all) when
    the pieces are joined, even where the bytes are not valid UTF-8."""
    rng = random.Random(7)
    for _ in range(200):
        ids = [rng.randrange(bpe.vocab_size) for _ in range(rng.randint(1, 30))]
        pieces = list(decode_stream(bpe, ids))
        assert "".join(pieces) == bpe.decode(ids), ids
