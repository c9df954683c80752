"""The token cache (pygpt.data.text.TokenFile) against damage and clutter: a cache cut short, with
a changed byte, or from a pygpt that recorded no length and digest is detected when mapped and
tokenized again (never used: it would train on wrong tokens and report wrong bits per char), and
writing a cache removes those of the data file's earlier contents so they do not pile up."""

import json

import pytest

from pygpt.data.text import TokenFile
from pygpt.tokenizer import CharTokenizer
from test_data_cache import TEXT, cache_files, corpus, user_cache  # noqa: F401 (fixtures)


# --- damaged and stale caches -----------------------------------------------------------------

def _tokens_file(folder):
    return folder / next(n for n in cache_files(folder) if not n.endswith(".json"))


@pytest.mark.parametrize("damage", ["truncated", "flipped", "old-metadata", "deep-metadata"])
def test_damaged_cache_is_detected_and_rebuilt(corpus, user_cache, capsys, damage):
    """A cache cut short (a full disk, a kill), with a changed byte (same length), or with the
    metadata of a pygpt that recorded no length or digest is tokenized again, never used."""
    tok = CharTokenizer.from_text(TEXT)
    TokenFile.load(corpus, tok)
    tokens = _tokens_file(corpus.parent)
    raw = tokens.read_bytes()
    if damage == "truncated":
        tokens.write_bytes(raw[: len(raw) // 2])
    elif damage == "flipped":
        tokens.write_bytes(raw[:10] + bytes([raw[10] ^ 1]) + raw[11:])
    elif damage == "old-metadata":
        tokens.with_name(tokens.name + ".json").write_text(json.dumps({"chars": len(TEXT)}))
    else:  # nested past Python's json recursion limit
        tokens.with_name(tokens.name + ".json").write_text("[" * 100000 + "]" * 100000)
    tf = TokenFile.load(corpus, tok)
    assert "token cache" in capsys.readouterr().err
    assert tf.tokens.tolist() == tok.encode(TEXT) and tf.n_chars == len(TEXT)
    assert tokens.read_bytes() == raw and len(cache_files(corpus.parent)) == 2


def test_caches_of_earlier_contents_are_removed(corpus, user_cache):
    """Editing the data file many times leaves the caches of its current content only (one per
    tokenizer); another file's caches in the same folder stay."""
    tok, other_tok = CharTokenizer.from_text(TEXT + "XYZ"), CharTokenizer.from_text(TEXT + "XQ")
    neighbour = corpus.parent / "other.txt"
    neighbour.write_text(TEXT, encoding="utf-8")
    TokenFile.load(neighbour, tok)
    for i in range(4):
        corpus.write_text(TEXT + "X" * i, encoding="utf-8")
        TokenFile.load(corpus, tok)
    mine = [n for n in cache_files(corpus.parent) if n.startswith(".corpus.txt.")]
    assert len(mine) == 2
    TokenFile.load(corpus, other_tok)  # the same content, another tokenizer: both kept
    assert len([n for n in cache_files(corpus.parent) if n.startswith(".corpus.txt.")]) == 4
    assert len([n for n in cache_files(corpus.parent) if n.startswith(".other.txt.")]) == 2
    assert TokenFile.load(corpus, tok).tokens.tolist() == tok.encode(TEXT + "XXX")
