"""Extractive question answering data in the SQuAD format (--task qa): a question's rows for
the model, [CLS] question [SEP] context-window [SEP], ready to batch. Reading a v1.1 or v2.0
file is pygpt_runtime.squad's.

Rows (pygpt_runtime.answering's, which the runtime shares): the context is cut into words as a
WordPiece tokenizer splits it (pygpt_runtime.text.word_spans), each word into the tokenizer's
pieces, and a piece's characters are its word's (so a predicted span is whole words of the
original context, as BERT's run_squad gives). A context
longer than a row holds is read in windows overlapping by `stride` pieces (a document stride);
a window that does not hold the whole answer, and an unanswerable question, point at [CLS]
(position 0). A question whose pieces leave no room for the context in a row is refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from pygpt.data.common import Rows, pad_rows
from pygpt.tokenizer import require_specials
from pygpt_runtime.answering import Pieces, QARow, context_pieces, question_rows
from pygpt_runtime.squad import Answer, Question


def answer_pieces(pieces: Pieces, answer: Answer) -> tuple[int, int]:
    """The first and last piece (inclusive) of the words answer's characters touch."""
    end = answer.start + len(answer.text)
    first = next(i for i, (_, e) in enumerate(pieces.spans) if e > answer.start)
    last = max(i for i, (s, _) in enumerate(pieces.spans) if s < end)
    return first, last


class QABatch(NamedTuple):
    """One batch of rows, batch first; its fields are the model's keyword arguments."""
    input_ids: torch.Tensor    # (B, T) int64; [PAD] past lengths
    segment_ids: torch.Tensor  # (B, T) int64: 0 for [CLS] question [SEP], 1 after
    lengths: torch.Tensor      # (B,) int64: real tokens, specials included
    labels: torch.Tensor       # (B, 2) int64: the answer's start and end positions


class EncodedQA(Rows):
    """Questions as the model's rows, ready to batch (`question_of`: each row's question;
    `pieces`: each question's context pieces). Errors name path and the question's id (path
    alone for a question without one: the command line's)."""

    def __init__(self, questions: Sequence[Question], tokenizer, block_size: int,
                 path: Union[str, Path] = "the data", stride: Optional[int] = None):
        specials: Mapping[str, int] = tokenizer.special_tokens
        require_specials(specials, ("[PAD]", "[CLS]", "[SEP]", "[UNK]"), "question rows")
        self.pad = specials["[PAD]"]
        self.questions = list(questions)
        self.rows: list[QARow] = []
        self.question_of: list[int] = []
        self.pieces: list[Pieces] = []
        by_context: dict[str, Pieces] = {}
        for n, q in enumerate(self.questions):
            try:
                if q.context not in by_context:
                    by_context[q.context] = context_pieces(q.context, tokenizer,
                                                           specials["[UNK]"])
                pieces = by_context[q.context]
                answer = answer_pieces(pieces, q.answers[0]) if q.answers else None
                rows = question_rows(tokenizer.encode(q.question), pieces.ids, answer,
                                     specials["[CLS]"], specials["[SEP]"], block_size, stride)
            except ValueError as e:
                where = f"{path}, question {q.id!r}" if q.id else path
                raise ValueError(f"{where}: {e}") from None
            self.pieces.append(pieces)
            self.rows += rows
            self.question_of += [n] * len(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def batch(self, which: Sequence[int]) -> QABatch:
        """The rows `which`, padded to the longest."""
        rows = [self.rows[i] for i in which]
        input_ids, segment_ids, lengths = pad_rows([np.array(r.ids, dtype=np.int64)
                                                    for r in rows],
                                                   [r.firsts[0] for r in rows], self.pad)
        labels = torch.tensor([[r.start, r.end] for r in rows], dtype=torch.int64)
        return QABatch(input_ids, segment_ids, lengths, labels)
