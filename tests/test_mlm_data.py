"""BERT pretraining batches (pygpt.data.mlm): lines read and tokenized as a stream; masking at
BERT's rate and 80/10/10 mix, never on specials or padding; [CLS] A [SEP] B [SEP] rows whose B
really follows A exactly when the NSP label says so (the text's lines are numbered, and every
token of line k is the id FIRST + k, so each token names its line); rows within block_size;
RoBERTa-style rows without NSP; a 90/10 contiguous split; determinism; clear errors."""
import numpy as np
import pytest
import torch

import pygpt.data.text as data
from pygpt.data.common import IGNORE_INDEX, truncate_pair
from pygpt.data.mlm import MLMBatch, MLMBatches, file_lines, mask_tokens, tokenize_lines

SPECIAL = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
PAD, CLS, SEP, MASK = 0, 2, 3, 4
FIRST = 5  # the first ordinary id: line k's tokens are all FIRST + k


def encode(text):
    """A stand-in tokenizer: one id per word "w<k>"; other words (like "#") give nothing."""
    return [FIRST + int(w[1:]) for w in text.split() if w.startswith("w")]


def numbered(n_lines, longest=6):
    """Line k is the word w<k> repeated 1..longest times."""
    return [" ".join([f"w{k}"] * (1 + k * 7 % longest)) for k in range(n_lines)]


def batches(n_lines=300, block_size=24, nsp=True, longest=6):
    segments = tokenize_lines(numbered(n_lines, longest), encode)
    return MLMBatches(segments, block_size, SPECIAL, FIRST + n_lines, nsp=nsp)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def unmasked(batch):
    return torch.where(batch.mlm_labels != IGNORE_INDEX, batch.mlm_labels, batch.input_ids)


def line_runs(tokens):
    """{line number: how many of its tokens} in order, for a piece of a row."""
    lines, counts = np.unique(np.asarray(tokens) - FIRST, return_counts=True)
    return dict(zip(lines.tolist(), counts.tolist()))


def check_whole_consecutive_lines(tokens, line_len):
    """A run of consecutive lines, all whole but the last (which truncation may cut)."""
    runs = line_runs(tokens)
    lines = list(runs)
    assert lines == list(range(lines[0], lines[0] + len(lines))), lines
    assert tokens[0] - FIRST == lines[0] and list(tokens) == sorted(tokens)
    assert all(runs[k] == line_len[k] for k in lines[:-1])
    assert runs[lines[-1]] <= line_len[lines[-1]]
    return lines


# --- reading and tokenizing -------------------------------------------------------------------

def test_tokenize_lines_skips_blank_lines_and_lines_that_encode_to_nothing():
    lines = iter(["w0 w0", "", "   ", "# nothing", "w1", "\tw2 w3 \r"])  # a one-shot stream
    segments = tokenize_lines(lines, encode)
    assert len(segments) == 3
    assert segments.offsets.tolist() == [0, 2, 3, 5]
    assert [segments.line(k).tolist() for k in range(3)] == [[5, 5], [6], [7, 8]]
    assert len(tokenize_lines([], encode)) == 0


def test_file_lines_streams_lines_cut_across_chunks(tmp_path, monkeypatch):
    text = "w1 w2\r\n\n" + "w3 " * 50 + "\nw4 é\nlast without newline"
    path = tmp_path / "t.txt"
    path.write_text(text, encoding="utf-8", newline="")
    monkeypatch.setattr(data, "CHUNK_BYTES", 3)
    assert list(file_lines(path)) == text.split("\n")
    with pytest.raises(FileNotFoundError, match="no data file"):
        list(file_lines(tmp_path / "missing.txt"))
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="is empty"):
        list(file_lines(tmp_path / "empty.txt"))


def test_shipped_corpus_end_to_end():
    """The shipped Shakespeare through from_file with a char-level stand-in tokenizer."""
    class Chars:
        special_tokens = SPECIAL
        vocab_size = FIRST + 128

        def encode(self, text):
            return [FIRST + ord(c) for c in text if ord(c) < 128]

    mlm = MLMBatches.from_file(None, Chars(), block_size=128)
    assert len(mlm.splits["train"]) > 25000 and len(mlm.splits["val"]) > 2500
    batch = mlm.batch("train", 64, gen())
    assert batch.input_ids.shape == (64, int(batch.lengths.max())) and batch.lengths.max() <= 128


# --- masking ----------------------------------------------------------------------------------

def random_rows(rows=3000, T=64, vocab=1000, seed=0):
    """Rows of ordinary ids with [CLS] first, [SEP]/[UNK] sprinkled in and [PAD] past lengths."""
    g = gen(seed)
    lengths = torch.randint(2, T + 1, (rows,), generator=g)
    ids = torch.randint(FIRST, vocab, (rows, T), generator=g)
    sprinkle = torch.rand(rows, T, generator=g)
    ids[sprinkle < 0.05] = SEP
    ids[sprinkle > 0.97] = SPECIAL["[UNK]"]
    ids[:, 0] = CLS
    ids[torch.arange(T) >= lengths[:, None]] = PAD
    return ids, lengths


def test_masking_statistics():
    """Each row gets exactly max(1, round(15%)) of its maskable tokens (so the overall rate is
    15% up to rounding: at most half a token a row); of the ~84,000 chosen, 80/10/10 within
    +-0.01, over 4 standard deviations of a binomial fraction (sqrt(.16/84000) = 0.0014) yet far
    below a wrong mix. Random ids are never special; nothing else changes."""
    vocab = 1000
    ids, lengths = random_rows(vocab=vocab)
    masked, labels = mask_tokens(ids, lengths, SPECIAL.values(), vocab, gen(1), MASK)
    real = torch.arange(ids.shape[1]) < lengths[:, None]
    maskable = real & (ids >= FIRST)
    chosen = labels != IGNORE_INDEX
    assert not (chosen & ~maskable).any()  # never specials nor padding
    n = maskable.sum(1)
    expected = torch.where(n > 0, (n * 0.15).round().clamp(min=1), 0).long()
    assert torch.equal(chosen.sum(1), expected)
    rate = chosen.sum().item() / n.sum().item()
    assert abs(rate - 0.15) <= 0.5 * len(ids) / n.sum().item() + 1e-9
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(masked[~chosen], ids[~chosen])
    new = masked[chosen]
    to_mask = (new == MASK).float().mean().item()
    to_random = ((new != MASK) & (new != ids[chosen])).float().mean().item()
    kept = (new == ids[chosen]).float().mean().item()
    assert abs(to_mask - 0.8) < 0.01 and abs(to_random - 0.1) < 0.01 and abs(kept - 0.1) < 0.01
    replaced = new[new != MASK]
    assert (replaced >= FIRST).all() and (replaced < vocab).all()


def test_masking_short_rows_and_rows_without_maskable_tokens():
    ids = torch.tensor([[CLS, 7, SEP, PAD], [CLS, SEP, PAD, PAD], [CLS, 9, 9, SEP]])
    lengths = torch.tensor([3, 2, 4])
    masked, labels = mask_tokens(ids, lengths, SPECIAL.values(), 20, gen(), MASK)
    assert (labels != IGNORE_INDEX).sum(1).tolist() == [1, 0, 1]  # at least one where possible
    assert labels[0].tolist() == [IGNORE_INDEX, 7, IGNORE_INDEX, IGNORE_INDEX]


def test_masking_is_deterministic_given_the_generator():
    ids, lengths = random_rows(rows=50)
    first = mask_tokens(ids, lengths, SPECIAL.values(), 1000, gen(3), MASK)
    again = mask_tokens(ids, lengths, SPECIAL.values(), 1000, gen(3), MASK)
    other = mask_tokens(ids, lengths, SPECIAL.values(), 1000, gen(4), MASK)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[1], other[1])


def test_masking_errors():
    ids, lengths = torch.tensor([[CLS, 7, SEP]]), torch.tensor([3])
    with pytest.raises(ValueError, match="probability"):
        mask_tokens(ids, lengths, SPECIAL.values(), 20, gen(), MASK, probability=0.0)
    with pytest.raises(ValueError, match="no non-special token"):
        mask_tokens(ids, lengths, SPECIAL.values(), 5, gen(), MASK)


# --- pairs ------------------------------------------------------------------------------------

def test_truncate_pair_matches_cutting_one_token_at_a_time():
    for budget in range(2, 12):
        for len_a in range(1, 20):
            for len_b in range(1, 20):
                a, b = len_a, len_b
                while a + b > budget:
                    a, b = (a - 1, b) if a > b else (a, b - 1)
                assert truncate_pair(len_a, len_b, budget) == (a, b)


@pytest.mark.parametrize("block_size,longest", [(24, 6), (5, 6), (9, 30), (64, 30)])
def test_pair_structure(block_size, longest):
    mlm = batches(block_size=block_size, longest=longest)
    line_len = [1 + k * 7 % longest for k in range(300)]
    batch = mlm.batch("train", 2000, gen())
    assert batch.input_ids.dtype == batch.segment_ids.dtype == torch.int64
    assert batch.lengths.dtype == batch.mlm_labels.dtype == batch.nsp_labels.dtype == torch.int64
    T = batch.input_ids.shape[1]
    assert T == batch.lengths.max() <= block_size
    assert batch.segment_ids.shape == batch.mlm_labels.shape == (2000, T)
    ids = unmasked(batch)
    for row, seg, length, labels, nsp in zip(ids, batch.segment_ids, batch.lengths.tolist(),
                                              batch.mlm_labels, batch.nsp_labels.tolist()):
        row, seg = row.tolist(), seg.tolist()
        seps = [p for p in range(length) if row[p] == SEP]
        assert row[0] == CLS and len(seps) == 2 and seps[1] == length - 1
        assert all(t == PAD for t in row[length:]) and all(t >= FIRST for t in row[1:length]
                                                          if t != SEP)
        a_end = seps[0]
        assert seg == [0] * (a_end + 1) + [1] * (length - a_end - 1) + [0] * (T - length)
        assert (labels[length:] == IGNORE_INDEX).all()
        a = check_whole_consecutive_lines(row[1:a_end], line_len)
        b = check_whole_consecutive_lines(row[a_end + 1:length - 1], line_len)
        if nsp == 1:
            assert b[0] == a[-1] + 1
        else:
            assert nsp == 0 and b[0] != a[-1] + 1 and not set(a) & set(b)
    assert abs(batch.nsp_labels.float().mean().item() - 0.5) < 0.05  # 2000 rows: sd 0.011


def test_rows_fill_the_budget_when_lines_allow():
    """A grows to about half the budget and B fills the rest: rows are not wastefully short."""
    batch = batches(block_size=64).batch("train", 500, gen())
    assert batch.lengths.float().mean() > 0.75 * 64


def test_without_nsp_rows_are_whole_consecutive_lines_up_to_block_size():
    """Lines of up to 30 tokens and rows of 20: a line longer than 18 is a row by itself, cut."""
    mlm = batches(block_size=20, nsp=False, longest=30)
    line_len = [1 + k * 7 % 30 for k in range(300)]
    n_train = len(mlm.splits["train"])
    batch = mlm.batch("train", 1000, gen())
    assert (batch.nsp_labels == IGNORE_INDEX).all() and (batch.segment_ids == 0).all()
    assert batch.input_ids.shape[1] == batch.lengths.max() <= 20
    for row, length in zip(unmasked(batch).tolist(), batch.lengths.tolist()):
        assert row[0] == CLS and row[length - 1] == SEP and SEP not in row[1:length - 1]
        assert all(t == PAD for t in row[length:])
        lines = check_whole_consecutive_lines(row[1:length - 1], line_len)
        assert length - 2 == (sum(line_len[k] for k in lines) if len(lines) > 1 else
                              min(line_len[lines[0]], 18))
        following = lines[-1] + 1
        if following < n_train:  # as many lines as fit: the next one would not
            assert length - 2 + line_len[following] > 18


def test_batches_are_deterministic_given_the_generator():
    mlm = batches()
    first, again, other = (mlm.batch("train", 16, gen(s)) for s in (7, 7, 8))
    assert isinstance(first, MLMBatch)
    assert MLMBatch._fields == ("input_ids", "segment_ids", "lengths", "mlm_labels", "nsp_labels")
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first.input_ids, other.input_ids)
    g = gen(7)
    mlm.batch("train", 16, g)
    assert not torch.equal(mlm.batch("train", 16, g).input_ids, first.input_ids)


def test_split_is_contiguous_90_10_and_val_batches_use_only_val_lines():
    mlm = batches()
    train, val = mlm.splits["train"], mlm.splits["val"]
    assert len(train) + len(val) == 300
    assert abs(len(train.ids) / (len(train.ids) + len(val.ids)) - 0.9) < 0.01
    last_train = int(train.ids.max())
    assert int(val.ids.min()) == last_train + 1
    for split, ok in (("val", lambda t: t > last_train), ("train", lambda t: t <= last_train)):
        for nsp in (True, False):
            mlm = batches(nsp=nsp)
            ids = unmasked(mlm.batch(split, 500, gen()))
            assert ok(ids[ids >= FIRST]).all(), (split, nsp)


# --- errors -----------------------------------------------------------------------------------

def test_too_small_text_or_block_size():
    with pytest.raises(ValueError, match="text too short: the val split has 1 non-empty line"):
        batches(n_lines=10)
    batches(n_lines=10, nsp=False)  # one line a split is enough without pairs
    with pytest.raises(ValueError, match="text too short: the val split has 0"):
        batches(n_lines=2, nsp=False)
    with pytest.raises(ValueError, match="block-size 4 is too small.*at least 5"):
        batches(block_size=4)
    batches(block_size=5)
    with pytest.raises(ValueError, match="block-size 2 is too small.*at least 3"):
        batches(block_size=2, nsp=False)
    batches(block_size=3, nsp=False)


def test_bad_tokenizers_are_refused():
    segments = tokenize_lines(numbered(100), encode)
    no_mask = {k: v for k, v in SPECIAL.items() if k != "[MASK]"}
    with pytest.raises(ValueError, match=r"no \[MASK\] token"):
        MLMBatches(segments, 16, no_mask, FIRST + 100)
    with pytest.raises(ValueError, match="outside a vocabulary of 50"):
        MLMBatches(segments, 16, SPECIAL, 50)
    with pytest.raises(ValueError, match="special token ids"):
        MLMBatches(segments, 16, dict(SPECIAL, **{"[MASK]": 500}), FIRST + 100)
    adds_specials = tokenize_lines(numbered(100), lambda t: [CLS] + encode(t) + [SEP])
    with pytest.raises(ValueError, match="encode must not add them"):
        MLMBatches(adds_specials, 16, SPECIAL, FIRST + 100)
