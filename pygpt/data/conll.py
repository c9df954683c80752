"""Token-tagged text in the CoNLL format, for named-entity tagging (--task tag): the label set,
and a sentence's rows for the model (its words' WordPiece pieces, the tag on each word's first
piece; a sentence longer than the context split at words into overlapping rows, each word
predicted from the row that reads it with the most context). Reading a file
(pygpt_runtime.conll), the rows and the entities tags mark (pygpt_runtime.tagging) are the
runtime's, which pygpt imports.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, NamedTuple, Sequence, Union

import numpy as np
import torch

from pygpt.data.common import IGNORE_INDEX, Rows, pad_rows
from pygpt.tokenizer import require_specials
from pygpt_runtime.conll import Sentence
from pygpt_runtime.tagging import OUTSIDE, word_rows


def labels(sentences: Sequence[Sentence]) -> list[str]:
    """The tags a model predicts: O, then each type's B- and I-, types sorted (an I- is there
    even when the data holds only one-word entities of its type)."""
    kinds = sorted({tag[2:] for s in sentences for tag in s.tags if tag != OUTSIDE})
    return [OUTSIDE, *(f"{p}-{kind}" for kind in kinds for p in "BI")]


class Window(NamedTuple):
    """A model row over part of a sentence: [CLS] its words' pieces [SEP]."""
    ids: list[int]
    labels: list[int]  # per position: the word's tag id at its first piece, else IGNORE_INDEX
    first: int  # the sentence's first word in it
    firsts: list[int]  # the position of each of its words' first piece


def windows(pieces: Sequence[Sequence[int]], tag_ids: Sequence[int], cls: int, sep: int,
            most: int, overlap: int) -> list[Window]:
    """A sentence's words (their pieces, their tag ids) in rows as the model reads them
    (pygpt_runtime.tagging.word_rows), each word's tag id at its first piece."""
    rows = []
    for row in word_rows(pieces, cls, sep, most, overlap):
        labels = [IGNORE_INDEX] * len(row.ids)
        for k, at in enumerate(row.firsts):
            labels[at] = tag_ids[row.first + k]
        rows.append(Window(row.ids, labels, row.first, row.firsts))
    return rows


class TagBatch(NamedTuple):
    """One batch of rows, batch first; its fields are the tagger's keyword arguments."""
    input_ids: torch.Tensor    # (B, T) int64; [PAD] past lengths
    segment_ids: torch.Tensor  # (B, T) int64: all 0 (one segment)
    lengths: torch.Tensor      # (B,) int64: real tokens, specials included
    labels: torch.Tensor       # (B, T) int64: a word's tag id at its first piece, else ignored


class EncodedTags(Rows):
    """Sentences as the model's rows (windows), ready to batch: each word's pieces from the
    tokenizer ([UNK] for a word it gives none), tags as indices into `labels`."""

    def __init__(self, sentences: Sequence[Sentence], labels: Sequence[str], tokenizer,
                 block_size: int, overlap: int, path: Union[str, Path] = "the data"):
        specials: Mapping[str, int] = tokenizer.special_tokens
        require_specials(specials, ("[PAD]", "[CLS]", "[SEP]", "[UNK]"), "tagging rows")
        index = {label: i for i, label in enumerate(labels)}
        self.pad = specials["[PAD]"]
        self.rows: list[Window] = []
        self.sentence_of: list[int] = []  # each row's sentence
        for n, s in enumerate(sentences):
            unknown = sorted(set(s.tags) - set(index))
            if unknown:
                raise ValueError(f"{path}, line {s.line}: tags {', '.join(unknown)} are not the "
                                 f"model's ({', '.join(labels)})")
            try:
                pieces = [tokenizer.encode(word) or [specials["[UNK]"]] for word in s.words]
            except ValueError as e:
                raise ValueError(f"{path}, line {s.line}: {e}") from None
            for row in windows(pieces, [index[t] for t in s.tags], specials["[CLS]"],
                               specials["[SEP]"], block_size, overlap):
                self.rows.append(row)
                self.sentence_of.append(n)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, which: Sequence[int]) -> TagBatch:
        """The rows `which`, padded to the longest (labels with IGNORE_INDEX)."""
        rows = [self.rows[i] for i in which]
        ids = [np.array(r.ids, dtype=np.int64) for r in rows]
        input_ids, segment_ids, lengths = pad_rows(ids, [len(r) for r in ids], self.pad)
        labels = torch.full_like(input_ids, IGNORE_INDEX)
        for b, r in enumerate(rows):
            labels[b, :len(r.labels)] = torch.tensor(r.labels)
        return TagBatch(input_ids, segment_ids, lengths, labels)
