"""Extractive question answering data in the SQuAD format (--task qa): reading a v1.1 or v2.0
JSON file, and a question's rows for the model, [CLS] question [SEP] context-window [SEP].

A file is {"data": [{"paragraphs": [{"context": C, "qas": [{"id", "question", "answers":
[{"text", "answer_start"}], "is_impossible"}]}]}]} ("title", "version" and v2.0's
"plausible_answers" are allowed and unread). An answerable question needs an answer whose text
is the context's at answer_start; v2.0's unanswerable ones (is_impossible true) have none, and
their answer is the [CLS] token. Every problem (a missing field, a wrong type, an answer not at
its answer_start, an empty context or question) is a ValueError naming the file and the
question's id (or the paragraph's place, for a paragraph's own fields).

Rows (pygpt_runtime.answering's, which the runtime shares): the context is cut into words as a
WordPiece tokenizer splits it (pygpt_runtime.text.word_spans), each word into the tokenizer's
pieces, and a piece's characters are its word's (so
a predicted span is whole words of the original context, as BERT's run_squad gives). A context
longer than a row holds is read in windows overlapping by `stride` pieces (a document stride);
a window that does not hold the whole answer, and an unanswerable question, point at [CLS]
(position 0). A question whose pieces leave no room for the context in a row is refused.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence, Union

import numpy as np
import torch

from pygpt.data.common import Rows, pad_rows
from pygpt.tokenizer import require_specials
from pygpt_runtime.answering import Pieces, QARow, context_pieces, question_rows
from pygpt_runtime.json_file import read_json


class Answer(NamedTuple):
    text: str
    start: int  # its first character in the context


class Question(NamedTuple):
    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]  # empty: unanswerable (v2.0's is_impossible)


class Paragraph(NamedTuple):
    context: str
    questions: list[Question]


def _field(obj: Mapping[str, Any], name: str, kind: type, where: str) -> Any:
    """obj[name], which must be of type kind; a ValueError naming where otherwise."""
    if name not in obj:
        raise ValueError(f"{where}: no {name!r}")
    value = obj[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: {name!r} must be a {kind.__name__}, got "
                         f"{type(value).__name__}")
    return value


def _question(qa: Any, context: str, path: Path, where: str) -> Question:
    """A question object of the file path, checked; where names its place until its id is
    known."""
    if not isinstance(qa, dict):
        raise ValueError(f"{where}: a question must be an object")
    qid = _field(qa, "id", str, where)
    if not qid:
        raise ValueError(f"{where}: empty 'id'")
    where = f"{path}, question {qid!r}"
    text = _field(qa, "question", str, where)
    if not text.strip():
        raise ValueError(f"{where}: empty question")
    impossible = qa.get("is_impossible", False)
    if not isinstance(impossible, bool):
        raise ValueError(f"{where}: 'is_impossible' must be true or false")
    answers = []
    for a in _field(qa, "answers", list, where) if not impossible else qa.get("answers") or []:
        if not isinstance(a, dict):
            raise ValueError(f"{where}: an answer must be an object")
        answer, start = _field(a, "text", str, where), _field(a, "answer_start", int, where)
        if not answer.strip():
            raise ValueError(f"{where}: empty answer text")
        if context[start:start + len(answer)] != answer or start < 0:
            found = context[max(start, 0):max(start, 0) + len(answer)]
            raise ValueError(f"{where}: answer {answer[:40]!r} is not at answer_start {start} "
                             f"(the context there reads {found[:40]!r})")
        answers.append(Answer(answer, start))
    if impossible and answers:
        raise ValueError(f"{where}: is_impossible, yet it has answers")
    if not impossible and not answers:
        raise ValueError(f"{where}: no answers (and not is_impossible)")
    return Question(qid, text, context, tuple(answers))


def read_squad(path: Union[str, Path]) -> list[Paragraph]:
    """The paragraphs of a SQuAD file, each with its questions (module docstring)."""
    path = Path(path)
    try:
        top = read_json(path, "SQuAD JSON")
    except FileNotFoundError:
        raise FileNotFoundError(f"no file at {path}") from None
    if not isinstance(top, dict):
        raise ValueError(f"{path}: SQuAD JSON is an object with a 'data' list")
    paragraphs = []
    for a, article in enumerate(_field(top, "data", list, str(path))):
        where = f"{path}, article {a}"
        if not isinstance(article, dict):
            raise ValueError(f"{where}: an article must be an object")
        for p, paragraph in enumerate(_field(article, "paragraphs", list, where)):
            where = f"{path}, article {a}, paragraph {p}"
            if not isinstance(paragraph, dict):
                raise ValueError(f"{where}: a paragraph must be an object")
            context = _field(paragraph, "context", str, where)
            qas = _field(paragraph, "qas", list, where)
            if not context.strip():
                names = ", ".join(repr(q.get("id")) for q in qas if isinstance(q, dict))
                raise ValueError(f"{where}: empty context" + (f" (questions {names})"
                                                              if names else ""))
            paragraphs.append(Paragraph(context, [
                _question(qa, context, path, f"{where}, question {k}")
                for k, qa in enumerate(qas)]))
    if not any(p.questions for p in paragraphs):
        raise ValueError(f"{path}: no questions")
    return paragraphs


def questions_of(paragraphs: Sequence[Paragraph]) -> list[Question]:
    return [q for p in paragraphs for q in p.questions]


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
