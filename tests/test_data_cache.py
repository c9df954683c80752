"""Reading training text and the token cache (pygpt.data.text): read_chunks reproduces a file exactly
however it is cut into chunks (multi-byte characters straddling the cuts); TokenFile tokenizes a
file once into a hidden memory-mapped file beside it (or in the user cache dir when that folder is
read-only), finds it again by the hash of the file's content and of the tokenizer, and never
serves stale tokens; bad files give errors that name the file and the byte offset."""

import os
import stat

import numpy as np
import pytest

import pygpt.data.text as data
from pygpt.data.text import TokenFile, read_chunks, read_text
from pygpt.tokenizer import BPETokenizer, CharTokenizer

# Shakespeare with characters of every UTF-8 length, combining marks, CRLF, blank lines, a long
# line without a break and a last line without a final newline.
TEXT = (data.SHIPPED_TEXT.read_text(encoding="utf-8")[:3000]
        + "\nZürich façade, naïve café. e\u0301\u0323\r\n\n"
        + "世界你好こんにちは " * 20 + "\n"
        + "😀👨\u200d👩\u200d👧🇫🇷 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\n\n\n"
        + "no final newline ∎")


@pytest.fixture
def corpus(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "corpus.txt"
    path.write_text(TEXT, encoding="utf-8", newline="")
    return path


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    """The user cache dir (the fallback for read-only data folders), moved into tmp_path."""
    folder = tmp_path / "user-cache" / "pygpt"
    monkeypatch.setattr(data, "USER_CACHE", folder)
    return folder


def cache_files(folder):
    return sorted(p.name for p in folder.iterdir() if ".tokens." in p.name) if folder.exists() else []


def forbid_tokenizing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the file was tokenized again instead of read from the cache")

    monkeypatch.setattr(data, "_tokenize_to", fail)


# --- read_chunks ------------------------------------------------------------------------------

def test_read_text_round_trip(corpus):
    assert read_text(corpus) == TEXT
    assert corpus.read_bytes() == TEXT.encode("utf-8")  # CRLF kept as written


@pytest.mark.parametrize("chunk_bytes", [1, 2, 3, 4, 5, 7, 13, 64, 1000])
def test_read_chunks_multi_chunk_reproduces_text(corpus, monkeypatch, chunk_bytes):
    """Small chunk sizes put the cut inside 2-, 3- and 4-byte characters many times over; the
    chunks still add up to the text exactly, none is empty, and each ends at a line break unless
    it holds none (a line longer than a chunk is passed on whole, never cut mid-character)."""
    monkeypatch.setattr(data, "CHUNK_BYTES", chunk_bytes)
    raw = corpus.read_bytes()
    # The cuts really do fall inside multi-byte characters at these sizes.
    inside = [i for i in range(chunk_bytes, len(raw), chunk_bytes) if 0x80 <= raw[i] < 0xC0]
    if chunk_bytes < 100:
        assert inside, "no chunk boundary inside a multi-byte character"
    chunks = list(read_chunks(corpus))
    assert "".join(chunks) == TEXT
    assert len(chunks) > 1
    assert all(chunks)
    for chunk in chunks:
        assert chunk.endswith("\n") or "\n" not in chunk, repr(chunk)
    assert read_text(corpus) == TEXT


def test_read_chunks_in_megabyte_chunks(tmp_path):
    """Over the real chunk size: a 2.5 MB file of 3-byte characters reads back exactly."""
    path = tmp_path / "big.txt"
    line = "€" * 999 + "\n"  # 2998 bytes per line, so the 1 MiB cuts fall inside characters
    text = line * 900
    path.write_text(text, encoding="utf-8")
    chunks = list(read_chunks(path))
    assert len(chunks) >= 3 and "".join(chunks) == text
    assert all(c.endswith("\n") for c in chunks)


# --- bad files --------------------------------------------------------------------------------

def test_empty_file_is_a_clear_error(tmp_path):
    path = tmp_path / "empty.txt"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=f"{path}.* is empty"):
        read_text(path)
    with pytest.raises(ValueError, match=f"{path}.* is empty"):
        TokenFile.load(path, CharTokenizer(["a"]))
    assert cache_files(tmp_path) == [] and sorted(os.listdir(tmp_path)) == ["empty.txt"]


def _bad_payload():
    """Valid text, then an invalid sequence (a 3-byte lead and one continuation byte, then an
    ASCII letter), then more text. Returns (bytes, offset of the bad sequence, its first byte)."""
    head = "héllo wörld 世界\n".encode("utf-8") * 3
    return head + b"\xe2\x82A more text\n", len(head), 0xE2


def _expected_from_python(raw: bytes):
    """Python's own decoder on the whole file: where the first invalid byte is."""
    with pytest.raises(UnicodeDecodeError) as info:
        raw.decode("utf-8")
    return info.value.start, raw[info.value.start]


@pytest.mark.parametrize("chunk_bytes", [1 << 20, 1000, 9, 7])
def test_non_utf8_error_names_file_byte_and_offset(tmp_path, monkeypatch, chunk_bytes):
    """The offset is from the start of the file, also when the bad byte is in a later chunk
    (these chunk sizes start the bad byte's chunk at a character boundary; see below for the
    others)."""
    raw, offset, byte = _bad_payload()
    assert _expected_from_python(raw) == (offset, byte)
    if chunk_bytes < len(raw):
        chunk_start = offset - offset % chunk_bytes
        assert not 0x80 <= raw[chunk_start] < 0xC0, "setup: a character straddles the cut"
        assert offset // chunk_bytes == (offset + 2) // chunk_bytes, "setup: sequence is cut"
        assert offset >= chunk_bytes  # the bad byte is in a later chunk
    path = tmp_path / "latin.txt"
    path.write_bytes(raw)
    monkeypatch.setattr(data, "CHUNK_BYTES", chunk_bytes)
    pattern = rf"{path} is not UTF-8 text \(invalid byte 0x{byte:02x} at offset {offset}\)"
    with pytest.raises(ValueError, match=pattern):
        read_text(path)
    knows_every_character = CharTokenizer.from_text(raw.decode("utf-8", errors="ignore"))
    with pytest.raises(ValueError, match=pattern):
        TokenFile.load(path, knows_every_character)
    assert cache_files(tmp_path) == []  # nothing half-written left behind
    assert sorted(os.listdir(tmp_path)) == ["latin.txt"]


def test_latin1_file(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("Ünïcödé\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{path} is not UTF-8.*0xdc at offset 0"):
        read_text(path)


@pytest.mark.parametrize("case", ["bad-sequence-cut-after-1", "bad-sequence-cut-after-2",
                                  "earlier-character-cut"])
def test_non_utf8_error_after_a_character_cut_by_the_chunk_boundary(tmp_path, monkeypatch, case):
    raw, offset, byte = _bad_payload()
    chunk_bytes = {"bad-sequence-cut-after-1": offset + 1, "bad-sequence-cut-after-2": offset + 2,
                   "earlier-character-cut": 30}[case]
    if case == "earlier-character-cut":  # the chunk holding the bad bytes starts mid-character
        assert 0x80 <= raw[offset - offset % chunk_bytes] < 0xC0
    monkeypatch.setattr(data, "CHUNK_BYTES", chunk_bytes)
    path = tmp_path / "bad.txt"
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=rf"invalid byte 0x{byte:02x} at offset {offset}\)"):
        read_text(path)


def test_file_ending_inside_a_character(tmp_path):
    path = tmp_path / "cut.txt"
    raw = "text then a euro: €".encode("utf-8")[:-1]
    path.write_bytes(raw)
    with pytest.raises(ValueError, match=rf"{path} is not UTF-8.*0xe2 at offset {len(raw) - 2}"):
        read_text(path)


# --- the token cache --------------------------------------------------------------------------

def test_first_load_writes_hidden_cache_beside_the_data(corpus, user_cache):
    tok = CharTokenizer.from_text(TEXT)
    tf = TokenFile.load(corpus, tok)
    names = cache_files(corpus.parent)
    assert len(names) == 2, names  # the tokens and their metadata
    assert all(n.startswith(".corpus.txt.") for n in names)
    assert any(n.endswith(".json") for n in names)
    assert not user_cache.exists() or cache_files(user_cache) == []
    assert not [n for n in os.listdir(corpus.parent) if ".tmp" in n]
    # The tokens are a read-only memory map of the file, equal to encoding the text.
    assert isinstance(tf.tokens, np.memmap) and tf.tokens.dtype == np.uint16
    assert not tf.tokens.flags.writeable
    assert tf.tokens.tolist() == tok.encode(TEXT)
    assert tf.n_chars == len(TEXT) and tf.chars_per_token == 1.0
    tokens_file = corpus.parent / next(n for n in names if not n.endswith(".json"))
    assert tokens_file.stat().st_size == 2 * len(TEXT)


def test_second_load_reuses_the_cache(corpus, user_cache, monkeypatch):
    tok = CharTokenizer.from_text(TEXT)
    first = TokenFile.load(corpus, tok)
    before = {n: (corpus.parent / n).stat().st_mtime_ns for n in cache_files(corpus.parent)}
    forbid_tokenizing(monkeypatch)
    second = TokenFile.load(corpus, CharTokenizer.from_text(TEXT))  # an equal tokenizer object
    assert np.array_equal(second.tokens, first.tokens)
    assert second.n_chars == first.n_chars
    after = {n: (corpus.parent / n).stat().st_mtime_ns for n in cache_files(corpus.parent)}
    assert after == before  # nothing rewritten


def test_bpe_tokens_equal_encode_and_reuse(corpus, user_cache, monkeypatch):
    bpe = BPETokenizer.train(TEXT, 300)
    tf = TokenFile.load(corpus, bpe)
    assert tf.tokens.tolist() == bpe.encode(TEXT)
    assert bpe.decode(tf.tokens) == TEXT
    assert tf.chars_per_token == pytest.approx(len(TEXT) / len(bpe.encode(TEXT)), rel=1e-12)
    assert tf.chars_per_token > 1.2
    forbid_tokenizing(monkeypatch)
    assert TokenFile.load(corpus, bpe).tokens.tolist() == tf.tokens.tolist()


def test_bpe_loaded_from_file_finds_the_same_cache(corpus, user_cache, monkeypatch, tmp_path):
    """The cache key hashes the tokenizer's JSON: a BPE tokenizer saved and loaded again (as a
    resumed or fine-tuned run has it) must hash the same, or every run would re-tokenize."""
    from pygpt.tokenizer import load_tokenizer

    bpe = BPETokenizer.train(TEXT, 300)
    first = TokenFile.load(corpus, bpe)
    bpe.save(tmp_path / "tokenizer.json")
    forbid_tokenizing(monkeypatch)
    again = TokenFile.load(corpus, load_tokenizer(tmp_path / "tokenizer.json"))
    assert again.tokens.tolist() == first.tokens.tolist()


def test_vocab_over_65536_is_stored_as_uint32(tmp_path, user_cache):
    chars = ["\n"] + [chr(c) for c in range(0x4E00, 0x4E00 + 73_000)
                      if not 0xD800 <= c < 0xE000][:69_999]
    tok = CharTokenizer(chars)
    text = "".join(chars[i] for i in range(0, 70_000, 7)) + "\n" + chars[-1]
    path = tmp_path / "wide.txt"
    path.write_text(text, encoding="utf-8")
    tf = TokenFile.load(path, tok)
    assert tf.tokens.dtype == np.uint32
    assert tf.tokens.tolist() == tok.encode(text) and int(tf.tokens.max()) == 69_999
    assert any(n.endswith(".tokens.uint32") for n in cache_files(tmp_path))


def test_multi_chunk_file_tokens(corpus, user_cache, monkeypatch):
    """Tokenized in many small chunks: the char tokens equal encoding the whole text, and the
    BPE tokens decode back to it exactly."""
    monkeypatch.setattr(data, "CHUNK_BYTES", 7)
    tok = CharTokenizer.from_text(TEXT)
    tf = TokenFile.load(corpus, tok)
    assert tf.tokens.tolist() == tok.encode(TEXT) and tf.n_chars == len(TEXT)
    bpe = BPETokenizer.train(TEXT, 300)
    tf_bpe = TokenFile.load(corpus, bpe)
    assert bpe.decode(tf_bpe.tokens) == TEXT
    assert tf_bpe.n_chars == len(TEXT)


def test_other_tokenizer_gets_its_own_cache(corpus, user_cache):
    tok_a = CharTokenizer.from_text(TEXT)
    tok_b = CharTokenizer.from_text(TEXT + "#§")  # same text, two more characters: other ids
    bpe = BPETokenizer.train(TEXT, 300)
    a = TokenFile.load(corpus, tok_a)
    names_a = set(cache_files(corpus.parent))
    b = TokenFile.load(corpus, tok_b)
    names_b = set(cache_files(corpus.parent)) - names_a
    c = TokenFile.load(corpus, bpe)
    names_c = set(cache_files(corpus.parent)) - names_a - names_b
    assert len(names_a) == len(names_b) == len(names_c) == 2
    assert a.tokens.tolist() == tok_a.encode(TEXT)
    assert b.tokens.tolist() == tok_b.encode(TEXT) != a.tokens.tolist()
    assert c.tokens.tolist() == bpe.encode(TEXT)
    # And each is found again for its own tokenizer.
    assert TokenFile.load(corpus, tok_a).tokens.tolist() == a.tokens.tolist()
    assert TokenFile.load(corpus, tok_b).tokens.tolist() == b.tokens.tolist()


def test_changed_content_is_tokenized_again(corpus, user_cache):
    """The cache is keyed by content, not by name, size or time: one character changed, with
    the same length and modification time, gives a new cache file and the new tokens."""
    tok = CharTokenizer.from_text(TEXT + "X")
    old = TokenFile.load(corpus, tok)
    old_names = set(cache_files(corpus.parent))
    st = corpus.stat()
    changed = TEXT.replace("First", "Xirst", 1)
    assert len(changed.encode("utf-8")) == st.st_size
    corpus.write_text(changed, encoding="utf-8", newline="")
    os.utime(corpus, ns=(st.st_atime_ns, st.st_mtime_ns))
    new = TokenFile.load(corpus, tok)
    assert new.tokens.tolist() == tok.encode(changed) != old.tokens.tolist()
    assert len(set(cache_files(corpus.parent)) - old_names) == 2


def _check_user_cache_fallback(corpus, user_cache, monkeypatch):
    tok = CharTokenizer.from_text(TEXT)
    tf = TokenFile.load(corpus, tok)
    assert tf.tokens.tolist() == tok.encode(TEXT)
    assert cache_files(corpus.parent) == []
    names = cache_files(user_cache)
    assert len(names) == 2 and all(n.startswith(".corpus.txt.") for n in names)
    forbid_tokenizing(monkeypatch)  # and found again there
    assert TokenFile.load(corpus, tok).tokens.tolist() == tf.tokens.tolist()


def test_read_only_data_folder_falls_back_to_user_cache(corpus, user_cache, monkeypatch):
    folder = corpus.parent
    mode = folder.stat().st_mode
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("chmod does not stop this user writing (running as root): see "
                        "test_unwritable_data_folder_falls_back_to_user_cache")
        _check_user_cache_fallback(corpus, user_cache, monkeypatch)
    finally:
        folder.chmod(mode)


def test_unwritable_data_folder_falls_back_to_user_cache(corpus, user_cache, monkeypatch):
    """The same as above where chmod cannot take the right away (root): writing beside the data
    fails with PermissionError, as the kernel would raise it."""
    real = data._tokenize_to

    def tokenize_to(path, tokenizer, dtype, out):
        if out.parent == corpus.parent:
            raise PermissionError(13, "Permission denied", str(out))
        return real(path, tokenizer, dtype, out)

    monkeypatch.setattr(data, "_tokenize_to", tokenize_to)
    _check_user_cache_fallback(corpus, user_cache, monkeypatch)


def test_no_writable_place_is_a_clear_error(corpus, user_cache, monkeypatch):
    def tokenize_to(path, tokenizer, dtype, out):
        raise PermissionError(13, "Permission denied", str(out))

    monkeypatch.setattr(data, "_tokenize_to", tokenize_to)
    with pytest.raises(PermissionError, match=rf"cannot write a token cache beside {corpus}"):
        TokenFile.load(corpus, CharTokenizer.from_text(TEXT))


def test_unknown_characters_are_refused_and_leave_no_cache(corpus, user_cache):
    tok = CharTokenizer.from_text(TEXT.replace("😀", ""))
    with pytest.raises(ValueError, match="'😀'"):
        TokenFile.load(corpus, tok)
    assert cache_files(corpus.parent) == []
    assert sorted(os.listdir(corpus.parent)) == ["corpus.txt"]


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no data file"):
        TokenFile.load(tmp_path / "nope.txt", CharTokenizer(["a"]))
