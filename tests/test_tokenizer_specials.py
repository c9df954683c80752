"""Special tokens (pygpt.tokenizer.SPECIAL_TOKENS) and the WordPiece tokenizer, for the BERT
family: WordPiece training, encoding (unknown characters -> [UNK]), decoding and its json; char
and byte-level BPE tokenizers built with the specials (their ids, their json, old char files
without them); the rules every kind shares: ordinary text never encodes to a special id unless
asked (parse_specials), a special id decodes as its name, decode_stream joins to decode."""

import json
import random
import re
import subprocess
import sys

import pytest

from pygpt.data.text import SHIPPED_TEXT
from pygpt.tokenizer import (SPECIAL_TOKENS, BPETokenizer, CharTokenizer, WordPieceTokenizer,
                             load_tokenizer, tokenizer_from_json)
from pygpt_runtime.text import decode_stream

NAMES = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}


@pytest.fixture(scope="module")
def corpus():
    """A few KB of Shakespeare: ASCII only, no square brackets."""
    text = SHIPPED_TEXT.read_text(encoding="utf-8")[:6000]
    assert text.isascii() and "[" not in text
    return text


@pytest.fixture(scope="module")
def wp(corpus):
    return WordPieceTokenizer.train(corpus, 300)


@pytest.fixture(scope="module")
def bpe(corpus):
    return BPETokenizer.train(corpus, 300, specials=True)


def words_of(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]+", text)


def test_special_tokens_constant():
    assert SPECIAL_TOKENS == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


# --- WordPiece: training and encoding ---------------------------------------------------------

def test_wordpiece_trains_to_the_size_with_specials_first(wp, corpus):
    assert wp.kind == "wordpiece" and wp.vocab_size == 300
    assert wp.special_tokens == NAMES
    assert wp.decode(range(5)) == " ".join(SPECIAL_TOKENS)
    vocab = json.loads(wp.to_json())["model"]["vocab"]
    assert len(vocab) == 300 and any(t.startswith("##") for t in vocab)
    ids = wp.encode(corpus)
    assert len(ids) < 0.5 * len(corpus) and min(ids) >= 5  # merges learned, no [UNK], no special


def test_wordpiece_from_chunks(corpus):
    """Training reads the file chunk by chunk: chunks cut at line breaks give the tokenizer the
    whole text gives."""
    lines = corpus.splitlines(keepends=True)
    chunks = ["".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    whole = WordPieceTokenizer.train(corpus, 200)
    pieces = WordPieceTokenizer.train(iter(chunks), 200)
    assert whole.vocab_size == pieces.vocab_size == 200
    assert whole.special_tokens == pieces.special_tokens == NAMES
    first = [json.loads(t.to_json())["model"]["vocab"] for t in (whole, pieces)]
    assert [sorted(v, key=v.get)[:5 + len(set(corpus) - set(" \n"))] for v in first] == \
        [list(SPECIAL_TOKENS) + sorted(set(corpus) - set(" \n"))] * 2  # then the sorted characters
    order = sorted(first[0], key=first[0].get)
    inner = [t for t in order if t.startswith("##") and len(t) == 3]
    assert inner and order[5 + len(set(corpus) - set(" \n")):][:len(inner)] == sorted(inner)
    words = " ".join(words_of(corpus))
    assert whole.decode(whole.encode(words)) == pieces.decode(pieces.encode(words)) == words
    assert whole.to_json() == pieces.to_json()


# A tokenizer learned in a fresh process from the first 200 KB of the shipped text with 2000
# tokens (the bert-baby preset's size), printed as its json.
_TRAIN_IN_A_PROCESS = """
import sys
from pygpt.data.text import SHIPPED_TEXT
from pygpt.tokenizer import BPETokenizer, WordPieceTokenizer
text = SHIPPED_TEXT.read_text(encoding="utf-8")[:200_000]
kind = sys.argv[1]
tok = (WordPieceTokenizer.train(text, 2000) if kind == "wordpiece"
       else BPETokenizer.train(text, 2000, specials=True))
sys.stdout.write(tok.to_json())
"""


@pytest.mark.parametrize("kind", ["wordpiece", "bpe"])
def test_training_gives_the_same_tokenizer_in_every_process(kind):
    """The same text gives the same tokenizer.json in separate processes (a seed gives the same
    run): the trainer's hash maps are seeded per process, so this needs processes, not calls."""
    runs = [subprocess.run([sys.executable, "-c", _TRAIN_IN_A_PROCESS, kind], check=True,
                           capture_output=True, text=True).stdout for _ in range(3)]
    assert json.loads(runs[0])["model"]["type"] == ("WordPiece" if kind == "wordpiece" else "BPE")
    assert runs[1] == runs[0] and runs[2] == runs[0]


def test_wordpiece_round_trip_of_words(wp, corpus):
    """Words separated by single spaces, with . , ! ? written against the word before, come back
    exactly; other spacing is normalised (one space between words and around other marks), and
    the decoded text encodes to the same ids again."""
    words = words_of(corpus)
    text = " ".join(words[:300])
    assert wp.decode(wp.encode(text)) == text
    for text in ["Hello, world! To be, or not to be.", "Who is there? Citizen."]:
        assert wp.decode(wp.encode(text)) == text
    assert wp.decode(wp.encode("a  b\n\tc  ")) == "a b c"
    assert wp.decode(wp.encode("What's this: a test; 'quoted'")) == \
        "What ' s this : a test ; ' quoted '"
    ids = wp.encode(corpus)
    assert wp.encode(wp.decode(ids)) == ids


def test_wordpiece_keeps_case_unless_lowercase(corpus):
    cased = WordPieceTokenizer.train(corpus, 300)
    assert cased.encode("First Citizen") != cased.encode("first citizen")
    text = "First Citizen first citizen"
    assert cased.decode(cased.encode(text)) == text
    lower = WordPieceTokenizer.train(corpus, 300, lowercase=True)
    assert lower.encode("FIRST Citizen Café") == lower.encode("first citizen cafe")
    assert lower.decode(lower.encode("FIRST Citizen")) == "first citizen"
    assert "F" not in json.loads(lower.to_json())["model"]["vocab"]


def test_wordpiece_unknown_characters_become_unk(wp):
    """Any text encodes: a word with a character the vocabulary lacks is one [UNK] (each CJK
    character is a word of its own)."""
    ids = wp.encode("the Zürich 😀 世界 king")
    assert ids == wp.encode("the") + [NAMES["[UNK]"]] * 4 + wp.encode("king")
    assert wp.decode(ids) == "the [UNK] [UNK] [UNK] [UNK] king"
    assert wp.encode("") == [] and wp.encode("\x00\x01") == []  # control characters dropped


def test_wordpiece_save_load_and_from_json(wp, corpus, tmp_path):
    path = tmp_path / "tokenizer.json"
    wp.save(path)
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]  # no temp file left
    for loaded in (load_tokenizer(path), tokenizer_from_json(wp.to_json())):
        assert isinstance(loaded, WordPieceTokenizer)
        assert loaded.special_tokens == NAMES and loaded.vocab_size == 300
        assert loaded.encode(corpus) == wp.encode(corpus)
        assert loaded.to_json() == wp.to_json()


def test_wordpiece_file_is_hf_bert_style(wp, tmp_path):
    """HF's own library reads the file and gets the same ids, except that it matches special
    names written in the text (it does by default; pygpt only with parse_specials)."""
    from tokenizers import Tokenizer

    spec = json.loads(wp.to_json())
    assert spec["model"]["type"] == "WordPiece" and spec["model"]["unk_token"] == "[UNK]"
    assert spec["model"]["continuing_subword_prefix"] == "##"
    assert spec["normalizer"]["type"] == "BertNormalizer"
    assert spec["normalizer"]["lowercase"] is False
    assert spec["pre_tokenizer"]["type"] == "BertPreTokenizer"
    assert spec["decoder"]["type"] == "WordPiece"
    assert [(t["id"], t["content"], t["special"]) for t in spec["added_tokens"]] == \
        [(i, name, True) for i, name in enumerate(SPECIAL_TOKENS)]
    wp.save(tmp_path / "tokenizer.json")
    hf = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "To be, or not to be Zürich"
    assert hf.encode(text).ids == wp.encode(text)
    assert hf.encode("[MASK]").ids == [4] != wp.encode("[MASK]")


@pytest.mark.parametrize("size", [5, 1, 0, -3])
def test_wordpiece_size_without_room_for_a_character_is_refused(corpus, size):
    with pytest.raises(ValueError, match=rf"vocab-size above 5 .*got {size}"):
        WordPieceTokenizer.train(corpus, size)


def test_wordpiece_size_below_the_alphabet_is_refused(corpus):
    """The trainer keeps every character (and its ## form) whatever the size asked: a size
    below that is refused with the smallest that fits, which then gives exactly that size."""
    with pytest.raises(ValueError, match=r"--vocab-size 20 is too small.* take (\d+)") as info:
        WordPieceTokenizer.train(corpus, 20)
    least = int(re.search(r"take (\d+)", str(info.value)).group(1))
    assert len(set(corpus)) < least < 2 * len(set(corpus)) + 5
    assert WordPieceTokenizer.train(corpus, least).vocab_size == least
    with pytest.raises(ValueError, match="too small"):
        WordPieceTokenizer.train(corpus, least - 1)


@pytest.mark.parametrize("text", ["", " \n\t ", ["", "\n"]])
def test_wordpiece_text_without_words_is_refused(text):
    with pytest.raises(ValueError, match="without words"):
        WordPieceTokenizer.train(text, 50)


def test_damaged_wordpiece_file_is_refused(wp, tmp_path):
    spec = json.loads(wp.to_json())
    del spec["model"]["unk_token"]
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid WordPiece tokenizer") as info:
        load_tokenizer(path)
    assert str(path) in str(info.value)


# --- char and BPE with specials ---------------------------------------------------------------

def test_char_specials_follow_the_characters(corpus):
    plain = CharTokenizer.from_text(corpus)
    tok = CharTokenizer.from_text(corpus, specials=True)
    n = len(plain.chars)
    assert tok.chars == plain.chars and tok.vocab_size == n + 5
    assert tok.special_tokens == {name: n + i for name, i in NAMES.items()}
    assert tok.encode(corpus) == plain.encode(corpus)  # the characters keep their ids
    assert tok.decode(tok.encode(corpus)) == corpus


def test_char_json_with_and_without_specials(corpus, tmp_path):
    tok = CharTokenizer.from_text(corpus, specials=True)
    assert json.loads(tok.to_json())["specials"] == list(SPECIAL_TOKENS)
    tok.save(tmp_path / "t.json")
    loaded = load_tokenizer(tmp_path / "t.json")
    assert loaded.special_tokens == tok.special_tokens and loaded.to_json() == tok.to_json()
    # Without specials the file is as before they existed (no key), so old files, and the data
    # caches keyed by the file's hash, are unchanged; an old file loads without specials.
    plain = CharTokenizer.from_text(corpus)
    assert json.loads(plain.to_json()) == {"kind": "char", "chars": plain.chars}
    old = tokenizer_from_json(json.dumps({"kind": "char", "chars": ["a", "b"]}))
    assert old.special_tokens == {} and old.vocab_size == 2 and old.specials == []


@pytest.mark.parametrize("specials", [["[PAD]", "[PAD]"], ["x"], [""], [3], 7])
def test_char_json_with_bad_specials_is_refused(specials):
    with pytest.raises(ValueError, match="not a valid char tokenizer"):
        tokenizer_from_json(json.dumps({"kind": "char", "chars": ["a"], "specials": specials}))


def test_bpe_specials_come_before_the_bytes(bpe, corpus):
    plain = BPETokenizer.train(corpus, 300)
    assert bpe.vocab_size == 300 and bpe.special_tokens == NAMES and plain.special_tokens == {}
    vocab = json.loads(bpe.to_json())["model"]["vocab"]
    plain_vocab = json.loads(plain.to_json())["model"]["vocab"]
    assert sorted(vocab, key=vocab.get)[:5] == list(SPECIAL_TOKENS)
    # The 256 bytes follow, each 5 ids later than in a BPE without specials.
    assert all(vocab[t] == plain_vocab[t] + 5 for t in plain_vocab if plain_vocab[t] < 256)
    text = "any Zürich 😀 text [x]"
    assert bpe.decode(bpe.encode(text)) == text and min(bpe.encode(text)) >= 5


def test_bpe_specials_json_round_trip(bpe, corpus, tmp_path):
    bpe.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert isinstance(loaded, BPETokenizer) and loaded.special_tokens == NAMES
    assert loaded.encode(corpus) == bpe.encode(corpus) and loaded.to_json() == bpe.to_json()


@pytest.mark.parametrize("size", [261, 257, 5])
def test_bpe_with_specials_needs_room_for_them(corpus, size):
    with pytest.raises(ValueError, match=rf"special tokens needs --vocab-size above 261, "
                                         rf"got {size}"):
        BPETokenizer.train(corpus, size, specials=True)
    assert BPETokenizer.train(corpus, 262, specials=True).vocab_size == 262


def test_special_tokens_empty_without_specials(corpus):
    assert CharTokenizer.from_text(corpus).special_tokens == {}
    assert BPETokenizer.train(corpus, 257).special_tokens == {}


# --- rules shared by the three kinds ----------------------------------------------------------

@pytest.fixture(scope="module", params=["char", "bpe", "wordpiece"])
def with_specials(request, corpus, bpe):
    """A tokenizer of each kind with specials, that knows the characters of their names (as
    text: a wordpiece tokenizer spells "[MASK]" as "[", "MASK", "]" then)."""
    text = corpus + "\n".join(SPECIAL_TOKENS)
    if request.param == "wordpiece":
        return WordPieceTokenizer.train(text, 300)
    return CharTokenizer.from_text(text, specials=True) if request.param == "char" else bpe


def test_names_in_text_are_text_unless_parsed(with_specials):
    tok = with_specials
    for name in SPECIAL_TOKENS:
        assert not set(tok.encode(f"a {name} b")) & set(tok.special_tokens.values())
        parsed = tok.encode(f"a {name} b", parse_specials=True)
        assert parsed.count(tok.special_tokens[name]) == 1
        assert parsed == tok.encode("a ") + [tok.special_tokens[name]] + tok.encode(" b")
    assert tok.encode("[MASK][CLS]", parse_specials=True) == [tok.special_tokens["[MASK]"],
                                                              tok.special_tokens["[CLS]"]]


def test_special_ids_decode_as_their_names(with_specials):
    tok = with_specials
    sp = tok.special_tokens
    ids = [sp["[CLS]"]] + tok.encode("the king") + [sp["[MASK]"], sp["[SEP]"], sp["[PAD]"]]
    expected = {"wordpiece": "[CLS] the king [MASK] [SEP] [PAD]"}.get(
        tok.kind, "[CLS]the king[MASK][SEP][PAD]")
    assert tok.decode(ids) == expected
    assert "".join(decode_stream(tok, ids)) == expected
    assert tok.decode(tok.encode("the [UNK] king", parse_specials=True)) == "the [UNK] king"


def test_char_specials_do_not_make_unknown_characters_known(corpus):
    tok = CharTokenizer.from_text(corpus, specials=True)  # no "[" in the corpus
    with pytest.raises(ValueError, match=r"not in the tokenizer's vocabulary: '\['"):
        tok.encode("[MASK]")
    assert tok.encode("a[MASK]b", parse_specials=True)[1] == tok.special_tokens["[MASK]"]
    with pytest.raises(ValueError, match="'é'"):
        tok.encode("é[MASK]", parse_specials=True)
    plain = CharTokenizer.from_text("ab")
    assert plain.encode("ab", parse_specials=True) == [0, 1]


# --- streaming decode -------------------------------------------------------------------------

def test_decode_stream_of_wordpiece_joins_to_decode(wp, corpus):
    text = "Hello, world! To be or not to be, that is the question."
    ids = wp.encode(text)
    pieces = list(decode_stream(wp, iter(ids)))
    assert len(pieces) == len(ids) and all(pieces)
    assert "".join(pieces) == wp.decode(ids) == text
    # A "##" piece continues its word, any other word starts with a space.
    assert [p for p, i in zip(pieces, ids) if wp.decode([i]) == "be"] == [" be", " be"]
    assert not any("##" in p for p in pieces)


def test_decode_stream_of_random_wordpiece_ids_matches_decode(wp):
    rng = random.Random(3)
    for _ in range(200):
        ids = [rng.randrange(wp.vocab_size) for _ in range(rng.randint(1, 30))]
        pieces = list(decode_stream(wp, ids))
        assert "".join(pieces) == wp.decode(ids), ids
        assert all(pieces)
