"""CoNLL files for entity tagging (pygpt.data.conll) and the entity-level score
(pygpt_runtime.conll): a file reads into sentences of words and BIO tags (CoNLL-2003's four
columns and -DOCSTART- lines too), an I- that begins an entity is read as B- and counted, bad
lines and unknown tag schemes are one line naming the file and line; entities and their
precision/recall/F1 per type and micro-averaged equal seqeval's (the conlleval rule) on
hand-picked and random tag sequences; sentences become rows of the context (split at words with
overlap, tags at each word's first piece) and padded batches."""
import random

import pytest

from pygpt.data.conll import labels
from pygpt_runtime.conll import read_conll, repair
from pygpt_runtime.tagging import Entity, entities
from pygpt_runtime.conll import score


def write(tmp_path, text, name="data.conll"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_reads_into_sentences_of_words_and_tags(tmp_path):
    path = write(tmp_path, "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n"
                           "German JJ B-NP B-MISC\n\nPeter\tB-PER\nBlackburn\tI-PER\n\n\n")
    tagged = read_conll(path)
    assert [(s.words, s.tags, s.line) for s in tagged.sentences] == [
        (("EU", "rejects", "German"), ("B-ORG", "O", "B-MISC"), 3),
        (("Peter", "Blackburn"), ("B-PER", "I-PER"), 7)]
    assert tagged.repaired == 0
    assert labels(tagged.sentences) == ["O", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER",
                                        "I-PER"]


def test_an_i_tag_that_begins_an_entity_is_read_as_b_and_counted(tmp_path):
    tagged = read_conll(write(tmp_path, "a I-PER\nb I-PER\nc O\nd I-LOC\ne I-PER\n"))
    assert tagged.sentences[0].tags == ("B-PER", "I-PER", "O", "B-LOC", "B-PER")
    assert tagged.repaired == 3
    assert repair(["B-PER", "I-PER", "I-LOC"]) == (["B-PER", "I-PER", "B-LOC"], 1)


@pytest.mark.parametrize("text, message", [
    ("a B-PER\nlonely\n", r"line 2: 'lonely' has no tag"),
    ("a S-PER\n", r"line 1: tag 'S-PER' is not O, B-TYPE or I-TYPE"),
    ("a PER\n", r"line 1: tag 'PER' is not O"),
    ("a B-\n", r"line 1: tag 'B-' is not O"),
    ("\n\n-DOCSTART- O\n", r"no tagged words"),
])
def test_bad_files_are_one_line_naming_the_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as e:
        read_conll(write(tmp_path, text))
    assert "\n" not in str(e.value) and "data.conll" in str(e.value)


def test_a_file_that_is_not_utf8_or_not_there(tmp_path):
    path = tmp_path / "bad.conll"
    path.write_bytes(b"a O\n\xff B-PER\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_conll(path)
    with pytest.raises(FileNotFoundError, match="no file at"):
        read_conll(tmp_path / "missing.conll")


def test_entities_are_the_spans_the_tags_mark():
    assert entities(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-LOC", "I-PER"]) == [
        Entity("PER", 0, 2), Entity("LOC", 3, 4), Entity("LOC", 4, 6), Entity("PER", 6, 7)]
    assert entities([]) == [] and entities(["O", "O"]) == []


def random_tags(rng, n):
    return [rng.choice(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"])
            for _ in range(n)]


def test_scores_equal_seqevals():
    metrics = pytest.importorskip("seqeval.metrics")
    rng = random.Random(0)
    for _ in range(50):
        gold = [random_tags(rng, rng.randint(0, 12)) for _ in range(rng.randint(1, 6))]
        predicted = [[t if rng.random() < 0.7 else rng.choice(["O", "B-PER", "I-LOC", "B-ORG"])
                      for t in sentence] for sentence in gold]
        ours = score(gold, predicted)
        theirs = metrics.classification_report(gold, predicted, output_dict=True,
                                               zero_division=0)
        for kind in set(ours) - {"micro"}:
            if kind in theirs:
                got = theirs[kind]
                assert ours[kind] == pytest.approx(
                    (got["precision"], got["recall"], got["f1-score"], got["support"]))
        assert ours["micro"][:3] == pytest.approx(
            (metrics.precision_score(gold, predicted, zero_division=0),
             metrics.recall_score(gold, predicted, zero_division=0),
             metrics.f1_score(gold, predicted, zero_division=0)))


def test_scoring_refuses_sequences_that_do_not_match():
    with pytest.raises(ValueError, match="2 predicted sentences for 1"):
        score([["O"]], [["O"], ["O"]])
    with pytest.raises(ValueError, match="sentence 0: 1 predicted tags for 2 words"):
        score([["O", "O"]], [["O"]])


def test_a_sentence_that_fits_is_one_row_labelled_at_each_words_first_piece():
    from pygpt.data.common import IGNORE_INDEX as IGNORED
    from pygpt.data.conll import windows

    with pytest.raises(ValueError, match="every word needs at least one piece"):
        windows([[10], []], [0, 1], cls=1, sep=2, most=8, overlap=2)
    rows = windows([[10], [11, 12], [13]], [0, 1, 2], cls=1, sep=2, most=8, overlap=2)
    assert rows == [(([1, 10, 11, 12, 13, 2]), [IGNORED, 0, 1, IGNORED, 2, IGNORED], 0,
                     [1, 2, 4])]


def test_a_long_sentence_is_split_at_words_with_overlap_and_each_word_read_once_best():
    from pygpt.data.common import IGNORE_INDEX as IGNORED
    from pygpt_runtime.windows import best_windows
    from pygpt.data.conll import windows

    rng = random.Random(1)
    for _ in range(200):
        n = rng.randint(1, 30)
        pieces = [[100 + 10 * w + p for p in range(rng.randint(1, 4))] for w in range(n)]
        most, overlap = rng.randint(3, 12), rng.randint(0, 3)
        if overlap >= most - 2:
            with pytest.raises(ValueError, match="holds no word"):
                windows(pieces, list(range(n)), 1, 2, most, overlap)
            continue
        rows = windows(pieces, list(range(n)), 1, 2, most, overlap)
        covered = set()
        for row in rows:
            assert len(row.ids) <= most and row.ids[0] == 1 and row.ids[-1] == 2
            words = range(row.first, row.first + len(row.firsts))
            for w, at in zip(words, row.firsts):
                assert row.ids[at] == pieces[w][0] and row.labels[at] == w
            assert sum(label != IGNORED for label in row.labels) == len(row.firsts)
            covered.update(words)
        assert covered == set(range(n))  # every word in some row, rows in order, progress made
        assert [r.first for r in rows] == sorted({r.first for r in rows})
        for before, after in zip(rows, rows[1:]):  # the overlap: shared words, when it can
            shared = before.first + len(before.firsts) - after.first
            if overlap and len(before.firsts) > 1:
                assert shared >= 1
            assert shared >= 0
        chosen = best_windows(rows, n)
        assert all(rows[r].ids[at] == pieces[w][0] for w, (r, at) in enumerate(chosen))


def test_sentences_become_padded_batches_with_tags_at_first_pieces():
    from pygpt.data.common import IGNORE_INDEX as IGNORED
    from pygpt.data.conll import EncodedTags
    from pygpt_runtime.conll import Sentence
    from pygpt.tokenizer import WordPieceTokenizer

    text = "the cat sat on the mat . peter blackburn went to london .\n" * 20
    tok = WordPieceTokenizer.train(text, vocab_size=60)
    sentences = [Sentence(("peter", "blackburn", "went", "to", "london"),
                          ("B-PER", "I-PER", "O", "O", "B-LOC"), 1),
                 Sentence(("the", "cat"), ("O", "O"), 7)]
    tags = labels(sentences)
    encoded = EncodedTags(sentences, tags, tok, block_size=64, overlap=4)
    assert len(encoded) == 2 and encoded.sentence_of == [0, 1]
    batch = encoded.batch([0, 1])
    assert batch.input_ids.shape == batch.labels.shape and not batch.segment_ids.any()
    for b, s in enumerate(sentences):
        n = int(batch.lengths[b])
        assert batch.input_ids[b, 0] == tok.special_tokens["[CLS]"]
        assert batch.input_ids[b, n - 1] == tok.special_tokens["[SEP]"]
        assert (batch.input_ids[b, n:] == tok.special_tokens["[PAD]"]).all()
        got = [tags[i] for i in batch.labels[b].tolist() if i != IGNORED]
        assert got == list(s.tags) and (batch.labels[b, n - 1:] == IGNORED).all()
    with pytest.raises(ValueError, match=r"the data, line 9: tags B-ORG are not the model's"):
        EncodedTags([Sentence(("x",), ("B-ORG",), 9)], tags, tok, 64, 4)
