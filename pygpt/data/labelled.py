"""Labelled examples for classification: reading them, the held-out split, and batches.

A labelled file is UTF-8 TSV or CSV (by its extension, .tsv or .csv; otherwise the delimiter is
sniffed) with a header row naming a `label` and a `text` column, and optionally `text_pair` (for
tasks on pairs of texts); other columns are ignored. Labels are strings without control
characters; a model's classes are their sorted list. Each example is one line: a quoted field may
hold the delimiter but not a line break, so an unmatched `"` (which would swallow the lines after
it into one field) is refused at the line where it opens. Every problem with a file is a
ValueError naming the file and, for a bad row, its line.

Rows are [CLS] text [SEP] (text_pair [SEP]), the longer of the two cut from its end until the
row fits the model's block_size; segment ids are 0 up to the first [SEP] and 1 after it. Batches
are right-padded with [PAD] to their longest row, `lengths` saying where each row's padding
starts, exactly as pygpt.data.mlm's pretraining batches.
"""
from __future__ import annotations

import csv
import io
from collections import Counter
import unicodedata
from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from pygpt.data.common import Rows, pad_rows, truncate_pair
from pygpt.tokenizer import require_specials

REQUIRED_COLUMNS = ("label", "text")
VAL_FRACTION = 0.1
SPLIT_SEED = 0  # the held-out split is a function of the file alone


class Example(NamedTuple):
    text: str
    text_pair: Optional[str]
    label: str
    line: int  # in its file, for error messages


class ClassificationBatch(NamedTuple):
    """One batch, batch first; its fields are BERT.forward's keyword arguments."""
    input_ids: torch.Tensor    # (B, T) int64; [PAD] past lengths
    segment_ids: torch.Tensor  # (B, T) int64: 0 for [CLS] text [SEP], 1 for text_pair [SEP]
    lengths: torch.Tensor      # (B,) int64: real tokens, specials included
    labels: torch.Tensor       # (B,) int64: the class index (into the sorted labels)


def _delimiter(path: Path, text: str) -> str:
    suffix = path.suffix.lower()
    if suffix in (".tsv", ".tab"):
        return "\t"
    if suffix == ".csv":
        return ","
    try:
        return csv.Sniffer().sniff(text.split("\n", 1)[0], delimiters="\t,;").delimiter
    except csv.Error:
        raise ValueError(f"{path}: cannot tell whether it is TSV or CSV from its header; name it "
                         ".tsv or .csv") from None


def read_labelled(path: Union[str, Path]) -> list[Example]:
    """The examples of a labelled TSV or CSV file (see the module's doc), in file order."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise FileNotFoundError(f"no labelled data file at {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; expected a TSV or CSV file") from None
    except UnicodeDecodeError as e:
        line = e.object[:e.start].count(b"\n") + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (invalid byte 0x{e.object[e.start]:02x});"
                         " convert it to UTF-8 first") from None
    if not text.strip():
        raise ValueError(f"{path} is empty; expected a header row with "
                         f"{' and '.join(REQUIRED_COLUMNS)} columns, then one row per example")
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=_delimiter(path, text))
    try:
        header = [name.strip() for name in next(reader)]
        missing = [name for name in REQUIRED_COLUMNS if name not in header]
        if missing:
            raise ValueError(f"{path}:1: the header has no {' or '.join(missing)} column (it has "
                             f"{', '.join(map(repr, header))}); expected {', '.join(REQUIRED_COLUMNS)}"
                             " and optionally text_pair")
        col = {name: header.index(name) for name in (*REQUIRED_COLUMNS, "text_pair")
               if name in header}
        examples = []
        while True:
            line = reader.line_num + 1  # where the row starts
            row = next(reader, None)
            if row is None:
                break
            if any("\n" in cell or "\r" in cell for cell in row):
                raise ValueError(f"{path}:{line}: a quoted field opens here and does not close "
                                 'on this line (an unmatched "?); write a " inside a quoted '
                                 'field as "", and keep each example on one line')
            if not any(cell.strip() for cell in row):
                continue  # a blank line
            if len(row) != len(header):
                raise ValueError(f"{path}:{line}: {len(row)} fields where the header has "
                                 f"{len(header)}")
            values = {name: row[i].strip() for name, i in col.items()}
            for name, value in values.items():
                if not value:
                    raise ValueError(f"{path}:{line}: the {name} is empty")
            check_label(values["label"], f"{path}:{line}")
            examples.append(Example(values["text"], values.get("text_pair"), values["label"],
                                    line))
    except csv.Error as e:
        raise ValueError(f"{path}:{reader.line_num}: {e}") from None
    if not examples:
        raise ValueError(f"{path} has a header but no examples")
    return examples


def check_label(label: str, where: str) -> None:
    """A ValueError naming where unless label is text fit to print: no control characters (a
    terminal would act on escape sequences in a label that a classifier prints)."""
    bad = next((c for c in label if unicodedata.category(c) == "Cc"), None)
    if bad is not None:
        raise ValueError(f"{where}: the label {label!r} holds the control character "
                         f"{bad!r}; labels are printed, so they must be plain text")


def check_labels(labels: Sequence[str], where: str) -> None:
    """A ValueError naming where unless labels can be a classifier's class names: each its own
    (an output per name) and fit to print (check_label). A checkpoint's labels.json and a
    converted folder's id2label are held to it."""
    repeated = sorted(x for x, n in Counter(labels).items() if n > 1)
    if repeated:
        raise ValueError(f"{where} names {', '.join(map(repr, repeated))} more than once; "
                         "each of the model's outputs needs its own label")
    for label in labels:
        check_label(label, where)


def labels_of(examples: Sequence[Example], path: Union[str, Path]) -> list[str]:
    """The sorted distinct labels of examples; a ValueError if there are fewer than two."""
    labels = sorted({e.label for e in examples})
    if len(labels) < 2:
        raise ValueError(f"{path}: every example is labelled {labels[0]!r}; a classifier needs "
                         "at least two classes")
    return labels


def unknown_labels(examples: Sequence[Example], labels: Sequence[str],
                   path: Union[str, Path]) -> None:
    """A ValueError naming the labels of examples that are not among labels (and where)."""
    known = set(labels)
    unknown = {e.label: e.line for e in reversed(examples) if e.label not in known}
    if unknown:
        shown = ", ".join(f"{label!r} (first on line {line})"
                          for label, line in sorted(unknown.items(), key=lambda kv: kv[1]))
        raise ValueError(f"{path}: labels the model does not know: {shown}; it knows "
                         f"{', '.join(map(repr, labels))}")


def held_out_split(examples: Sequence[Example], fraction: float = VAL_FRACTION,
                   ) -> tuple[list[Example], list[Example]]:
    """(train, val): round(fraction * n) examples of each label (leaving it at least one for
    training) drawn at random with a fixed seed, so the split is a function of the file and
    stratified. Both keep file order."""
    gen = torch.Generator().manual_seed(SPLIT_SEED)
    by_label: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        by_label.setdefault(e.label, []).append(i)
    val: set[int] = set()
    for label in sorted(by_label):
        idx = by_label[label]
        take = min(round(fraction * len(idx)), len(idx) - 1)
        val.update(idx[int(k)] for k in torch.randperm(len(idx), generator=gen)[:take])
    if not val:
        raise ValueError(f"too few examples ({len(examples)}) to hold {fraction:.0%} out for "
                         "validation; give --val-data")
    return ([e for i, e in enumerate(examples) if i not in val],
            [e for i, e in enumerate(examples) if i in val])


def counts(predicted: torch.Tensor, true: torch.Tensor,
           num_labels: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per class: (true positives, false positives, false negatives) of the predictions."""
    hit = predicted == true
    tp = torch.bincount(true[hit], minlength=num_labels)
    fp = torch.bincount(predicted[~hit], minlength=num_labels)
    fn = torch.bincount(true[~hit], minlength=num_labels)
    return tp, fp, fn


def macro_f1(tp: Sequence[float], fp: Sequence[float], fn: Sequence[float]) -> float:
    """The mean over classes of F1 = 2tp / (2tp + fp + fn), over the classes that were either
    true or predicted at least once (as scikit-learn's f1_score(average="macro")). The counts may
    all be scaled alike (means instead of sums): F1 does not change."""
    f1 = [2 * t / (2 * t + p + n) for t, p, n in zip(tp, fp, fn) if 2 * t + p + n > 0]
    return sum(f1) / len(f1) if f1 else float("nan")


class Encoded(Rows):
    """Examples as token rows ready to batch: [CLS] text [SEP] (text_pair [SEP]) with labels as
    indices into `labels`; texts longer than block_size are cut (see the module's doc)."""

    def __init__(self, examples: Sequence[Example], labels: Sequence[str], tokenizer,
                 block_size: int, path: Union[str, Path] = "the data"):
        specials: Mapping[str, int] = tokenizer.special_tokens
        require_specials(specials, ("[PAD]", "[CLS]", "[SEP]"), "classification rows")
        unknown_labels(examples, labels, path)
        pair = any(e.text_pair is not None for e in examples)
        if block_size < (5 if pair else 3):
            raise ValueError(f"block_size {block_size} cannot hold [CLS] text [SEP]"
                             + (" text_pair [SEP]" if pair else ""))
        self.pad = specials["[PAD]"]
        cls, sep = specials["[CLS]"], specials["[SEP]"]
        index = {label: i for i, label in enumerate(labels)}
        self.rows: list[np.ndarray] = []
        self.firsts: list[int] = []  # where segment B starts (= the row's length without one)
        for e in examples:
            try:
                a = tokenizer.encode(e.text)
                b = tokenizer.encode(e.text_pair) if e.text_pair is not None else None
            except ValueError as err:
                raise ValueError(f"{path}:{e.line}: {err}") from None
            if b is None:
                row = [cls, *a[:block_size - 2], sep]
                self.firsts.append(len(row))
            else:
                len_a, len_b = truncate_pair(len(a), len(b), block_size - 3)
                row = [cls, *a[:len_a], sep, *b[:len_b], sep]
                self.firsts.append(len_a + 2)
            self.rows.append(np.array(row, dtype=np.int64))
        self.labels = torch.tensor([index[e.label] for e in examples], dtype=torch.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, which: Sequence[int]) -> ClassificationBatch:
        """The rows `which`, padded to the longest."""
        which = list(which)
        return ClassificationBatch(*pad_rows([self.rows[i] for i in which],
                                             [self.firsts[i] for i in which], self.pad),
                                   self.labels[which])
