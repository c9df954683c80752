"""Parallel data (pygpt.data.parallel): reading line-aligned source/target files (plain and
gzip), refusing mismatched ones, skipping empty and over-long pairs, the batches' layout, and
token-budget bucketing; and the joint BPE tokenizer with the translator's special tokens."""
import gzip

import numpy as np
import pytest
import torch

from pygpt.data.common import IGNORE_INDEX
from pygpt.data.parallel import (ParallelCorpus, TranslationBatch, bucket_batches, read_lines,
                                 read_pairs)
from pygpt.tokenizer import (SEQ2SEQ_SPECIALS, BPETokenizer, CharTokenizer,
                             load_tokenizer)

SRC = ["ein Haus", "", "zwei Katzen", "   ", "ein sehr sehr langer Satz hier", "drei"]
TGT = ["a house", "nothing", "", "blank", "a very very long sentence here", "three"]


@pytest.fixture(scope="module")
def chars():
    """A char tokenizer over both sides with [PAD] [UNK] [BOS] [EOS] after the characters."""
    return CharTokenizer.from_text("".join(SRC + TGT), specials=SEQ2SEQ_SPECIALS)


def write(path, lines, gz=False, newline="\n"):
    data = "".join(line + newline for line in lines).encode("utf-8")
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def test_plain_gzip_and_crlf_files_read_the_same(tmp_path, chars):
    plain = ParallelCorpus.from_files(write(tmp_path / "s.txt", SRC), write(tmp_path / "t.txt", TGT),
                                      chars, max_len=20)
    packed = ParallelCorpus.from_files(write(tmp_path / "s.gz", SRC, gz=True),
                                       write(tmp_path / "t.txt.gz", TGT, gz=True, newline="\r\n"),
                                       chars, max_len=20)
    for a, b in ((plain.src, packed.src), (plain.tgt, packed.tgt)):
        assert np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)
    assert chars.decode(plain.src.line(0)) == "ein Haus"
    assert chars.decode(plain.tgt.line(1)) == "three"


def test_empty_and_long_pairs_are_skipped_and_counted(tmp_path, chars):
    corpus = ParallelCorpus.from_files(write(tmp_path / "s", SRC), write(tmp_path / "t", TGT),
                                       chars, max_len=20)
    # Pairs 1, 2, 3 have an empty side; pair 4 has 30 characters on each side.
    assert len(corpus) == 2 and (corpus.skipped_empty, corpus.skipped_long) == (3, 1)
    assert corpus.summary == "2 pairs; skipped 3 empty, 1 longer than 20 tokens"
    assert [chars.decode(corpus.tgt.line(k)) for k in range(2)] == ["a house", "three"]


@pytest.mark.parametrize("n_src, n_tgt", [(4, 3), (3, 5), (0, 2)])
def test_mismatched_line_counts_are_refused_with_both_counts(tmp_path, n_src, n_tgt):
    src = write(tmp_path / "src.txt", [f"s{i}" for i in range(n_src)])
    tgt = write(tmp_path / "tgt.txt", [f"t{i}" for i in range(n_tgt)])
    with pytest.raises(ValueError, match=rf"src.txt has {n_src} lines but \S*tgt.txt has "
                                         rf"{n_tgt}"):
        list(read_pairs(src, tgt))


def test_unreadable_files_are_refused_clearly(tmp_path, chars):
    good = write(tmp_path / "good.txt", ["ab", "cd"])
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\nfine\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"bad.txt is not UTF-8 text \(line 3 has the invalid "
                                         r"byte 0xff\)"):
        list(read_lines(bad))
    with pytest.raises(FileNotFoundError, match="no data file at .*missing.txt"):
        ParallelCorpus.from_files(tmp_path / "missing.txt", good, chars, max_len=5)
    (tmp_path / "fake.gz").write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="cannot read .*fake.gz"):
        list(read_lines(tmp_path / "fake.gz"))
    with pytest.raises(ValueError, match="is a directory"):
        list(read_lines(tmp_path))
    empty = write(tmp_path / "empty.txt", ["", " "])
    with pytest.raises(ValueError, match=r"no usable pairs \(0 pairs; skipped 2 empty"):
        ParallelCorpus.from_files(empty, empty, chars, max_len=5)


def test_a_tokenizer_without_the_translation_specials_is_refused(tmp_path):
    src = write(tmp_path / "s", ["ab"])
    with pytest.raises(ValueError, match=r"no \[BOS\], \[EOS\] token\(s\): translation batches "
                                         r"need \[PAD\], \[BOS\], \[EOS\] \(a translator's"):
        ParallelCorpus.from_files(src, src, CharTokenizer.from_text("ab", specials=True), 5)


def test_batch_layout():
    chars = CharTokenizer.from_text("abcdexyzw", specials=SEQ2SEQ_SPECIALS)
    pad, bos, eos = (chars.special_tokens[n] for n in ("[PAD]", "[BOS]", "[EOS]"))
    corpus = ParallelCorpus.from_pairs([("abc", "de"), ("a", "xyzw")], chars.encode,
                                       chars.special_tokens, max_len=8)
    batch = corpus.batch([1, 0])
    assert isinstance(batch, TranslationBatch)
    a, b, c, d, e, x, y, z, w = (chars.encode(ch)[0] for ch in "abcdexyzw")
    assert batch.src.tolist() == [[a, pad, pad], [a, b, c]]
    assert batch.src_lengths.tolist() == [1, 3]
    assert batch.tgt_in.tolist() == [[bos, x, y, z, w], [bos, d, e, pad, pad]]
    assert batch.tgt_out.tolist() == [[x, y, z, w, eos], [d, e, eos, IGNORE_INDEX, IGNORE_INDEX]]
    assert batch.tgt_lengths.tolist() == [5, 3]
    assert all(t.dtype == torch.int64 for t in batch)


def random_lengths(n, seed=0):
    """Source lengths 1..39 and target lengths near them, as translations have."""
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 40, n)
    return src, np.clip(src + rng.integers(-4, 5, n), 1, None)


def padded_size(batches, src, tgt):
    """Positions of the padded batches: rows x (longest source + longest target + [BOS])."""
    return sum(len(b) * (src[b].max() + tgt[b].max() + 1) for b in batches)


@pytest.mark.parametrize("max_tokens, chunk", [(200, 64), (1000, 1 << 16), (100, 7)])
def test_bucketing_covers_every_pair_once_within_the_budget(max_tokens, chunk):
    src, tgt = random_lengths(500)
    batches = bucket_batches(src, tgt, max_tokens, torch.Generator().manual_seed(3), chunk=chunk)
    seen = np.concatenate(batches)
    assert np.array_equal(np.sort(seen), np.arange(500))
    assert all(padded_size([b], src, tgt) <= max_tokens for b in batches)
    # Sorting within chunks pads less than batches of the same sizes drawn at random.
    shuffled = np.random.default_rng(1).permutation(500)
    cuts = np.cumsum([len(b) for b in batches])[:-1]
    assert padded_size(batches, src, tgt) < padded_size(np.split(shuffled, cuts), src, tgt)


def test_bucketing_is_a_function_of_the_generator():
    src, tgt = random_lengths(300)

    def order(seed):
        return np.concatenate(bucket_batches(src, tgt, 300, torch.Generator().manual_seed(seed),
                                             chunk=100)).tolist()

    assert order(1) == order(1) and order(1) != order(2)
    fixed = bucket_batches(src, tgt, 300)  # no generator: one sorted pass, in order
    firsts = [(src[b[0]], tgt[b[0]]) for b in fixed]
    assert firsts == sorted(firsts)


def test_bucketing_refuses_a_budget_below_the_longest_pair():
    with pytest.raises(ValueError, match=r"max_tokens 10 is less than the longest pair's 12 "
                                         r"tokens"):
        bucket_batches(np.array([3, 5]), np.array([2, 6]), 10)


def test_corpus_batches_pass_over_every_pair(chars):
    pairs = [("ab" * (k % 7 + 1), "c" * (k % 5 + 1)) for k in range(40)]
    corpus = ParallelCorpus.from_pairs(pairs, chars.encode, chars.special_tokens, max_len=14)
    batches = list(corpus.batches(40, torch.Generator().manual_seed(0)))
    assert sum(len(b.src) for b in batches) == 40
    assert all(b.src.numel() + b.tgt_in.numel() <= 40 for b in batches)
    got = sorted((chars.decode(s[:n].tolist()), chars.decode(t[1:m].tolist()))
                 for b in batches for s, n, t, m in zip(b.src, b.src_lengths, b.tgt_in,
                                                        b.tgt_lengths))
    assert got == sorted(pairs)


def test_joint_bpe_with_translation_specials(tmp_path):
    text = ["the cat sat on the mat", "die Katze sass auf der Matte"] * 20
    tok = BPETokenizer.train(text, 300, specials=SEQ2SEQ_SPECIALS)
    assert tok.special_tokens == {name: i for i, name in enumerate(SEQ2SEQ_SPECIALS)}
    assert tok.encode("[EOS]") != [3] and tok.encode("[EOS]", parse_specials=True) == [3]
    tok.save(tmp_path / "tokenizer.json")
    assert load_tokenizer(tmp_path / "tokenizer.json").special_tokens == tok.special_tokens
    with pytest.raises(ValueError, match="with the 4 special tokens needs --vocab-size above 260"):
        BPETokenizer.train(text, 260, specials=SEQ2SEQ_SPECIALS)
