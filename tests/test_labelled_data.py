"""Labelled data for classification (pygpt.data.labelled): TSV and CSV files, with and without
text pairs, every bad file named with its line, the stratified held-out split, rows as
[CLS] text [SEP] (text_pair [SEP]) cut to the block, and macro-F1 from per-class counts."""

import pytest
import torch

from pygpt.data.labelled import Encoded, counts, held_out_split, macro_f1, read_labelled
from pygpt.tokenizer import CharTokenizer


def write(path, header, rows, sep="\t"):
    path.write_text("\n".join(sep.join(r) for r in [header, *rows]) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name, sep", [("d.tsv", "\t"), ("d.csv", ","), ("d.txt", "\t"),
                                       ("d.dat", ",")])
@pytest.mark.parametrize("pair", [False, True])
def test_reads_tsv_and_csv_with_and_without_pairs(tmp_path, name, sep, pair):
    header = ("id", "text", "label") + (("text_pair",) if pair else ())
    rows = [("1", "a cat", "x") + (("sits",) if pair else ()),
            ("2", "a dog", "y") + (("runs",) if pair else ())]
    examples = read_labelled(write(tmp_path / name, header, rows, sep))
    assert [(e.text, e.text_pair, e.label, e.line) for e in examples] == [
        ("a cat", "sits" if pair else None, "x", 2), ("a dog", "runs" if pair else None, "y", 3)]


def test_csv_quoting(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('label,text\npos,"good, very good"\nneg,"say ""no"""\n', encoding="utf-8")
    assert [e.text for e in read_labelled(path)] == ["good, very good", 'say "no"']


@pytest.mark.parametrize("content, pattern", [
    (b"", r"d\.tsv is empty"),
    (b"label\ttext\n", r"d\.tsv has a header but no examples"),
    (b"label\tsentence\nx\ta\n", r"d\.tsv:1: the header has no text column"),
    (b"text\nx\n", r"d\.tsv:1: the header has no label column"),
    (b"label\ttext\nx\ta cat\ny\t\n", r"d\.tsv:3: the text is empty"),
    (b"label\ttext\nx\ta cat\n\ta dog\n", r"d\.tsv:3: the label is empty"),
    (b"label\ttext\nx\ta cat\ty\n", r"d\.tsv:2: 3 fields"),
    (b"label\ttext\nx\ta cat\ny\tcaf\xe9\n", r"d\.tsv:3: not UTF-8"),
])
def test_bad_files_name_the_file_and_line(tmp_path, content, pattern):
    path = tmp_path / "d.tsv"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=pattern):
        read_labelled(path)


def test_held_out_split_is_stratified_deterministic_and_disjoint(tmp_path):
    rows = [("a", f"t{i}") for i in range(50)] + [("b", f"u{i}") for i in range(30)]
    examples = read_labelled(write(tmp_path / "d.tsv", ("label", "text"), rows))
    train, val = held_out_split(examples)
    assert sorted(e.label for e in val) == ["a"] * 5 + ["b"] * 3
    assert sorted(train + val, key=lambda e: e.line) == examples
    assert held_out_split(examples) == (train, val)
    assert [e.line for e in val] == sorted(e.line for e in val)  # file order kept


def test_macro_f1_by_hand():
    true = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    pred = torch.tensor([0, 1, 0, 1, 2, 2, 2, 0, 2])
    # class 0: tp 2, fp 1, fn 1 -> 4/6; class 1: tp 1, fp 1, fn 1 -> 2/4; class 2: tp 3, fp 1,
    # fn 1 -> 6/8. A class never true nor predicted (3) does not count.
    tp, fp, fn = counts(pred, true, 4)
    assert tp.tolist() == [2, 1, 3, 0] and fp.tolist() == [1, 1, 1, 0]
    assert macro_f1(tp.tolist(), fp.tolist(), fn.tolist()) == pytest.approx(
        (4 / 6 + 2 / 4 + 6 / 8) / 3)
    assert macro_f1([x / 9 for x in tp.tolist()], [x / 9 for x in fp.tolist()],
                    [x / 9 for x in fn.tolist()]) == pytest.approx((4 / 6 + 2 / 4 + 6 / 8) / 3)



def test_rows_and_segments_of_pairs_cut_to_the_block(tmp_path):
    rows = [("x", "abcdef", "gh"), ("y", "ab", "c")]
    examples = read_labelled(write(tmp_path / "p.tsv", ("label", "text", "text_pair"), rows))
    tok = CharTokenizer.from_text("abcdefgh", specials=True)
    cls, sep, pad = (tok.special_tokens[n] for n in ("[CLS]", "[SEP]", "[PAD]"))
    enc = Encoded(examples, ["x", "y"], tok, block_size=8)
    batch = enc.batch([0, 1])
    # Row 0: 5 tokens of text for 3 + 2 in the budget of 8 - 3: the longer (A) is cut to 3.
    assert batch.input_ids.tolist() == [[cls, *tok.encode("abc"), sep, *tok.encode("gh"), sep],
                                        [cls, *tok.encode("ab"), sep, *tok.encode("c"), sep, pad,
                                         pad]]
    assert batch.segment_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1, 0, 0]]
    assert batch.lengths.tolist() == [8, 6] and batch.labels.tolist() == [0, 1]
    assert [b.labels.tolist() for b in enc.in_order(1)] == [[0], [1]]
    with pytest.raises(ValueError, match=r"p\.tsv: labels the model does not know: 'y' "
                                         r"\(first on line 3\)"):
        Encoded(examples, ["x", "z"], tok, 8, tmp_path / "p.tsv")
