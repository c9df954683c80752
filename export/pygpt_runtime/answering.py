"""A question answerer's side of a question, shared by pygpt (pygpt.data.squad, pygpt.tasks.qa,
pygpt.answer) and the runtime (onnx_bert.py), with numpy alone: the context as the tokenizer's
pieces, each with its word's characters; a question's rows, [CLS] question [SEP] context-window
[SEP], the windows overlapping by a stride; the best span over all the rows' start and end
logits; and how the answer commands print an answer (python -m pygpt.answer --question and
pygpt-run alike).

A question's answer is its best span over all its rows: start <= end, at most MAX_ANSWER pieces,
inside the context, starting at a piece read in the row that gives it the most context
(windows.best_windows, as BERT's run_squad), scored start logit + end logit. Where unanswerable
questions are allowed (v2.0), no answer is given when [CLS]'s score (its least over the rows)
beats the best span's by more than a threshold (0 by default, as the v2.0 baseline)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import numpy as np

from pygpt_runtime.text import word_spans
from pygpt_runtime.windows import best_windows

MAX_ANSWER = 30  # pieces of the longest answer predicted (run_squad's max_answer_length)


class Pieces(NamedTuple):
    """A context as the tokenizer's pieces, each with its word's characters [start, end)."""
    ids: list[int]
    spans: list[tuple[int, int]]


def context_pieces(context: str, tokenizer, unknown: int) -> Pieces:
    """context's pieces: each word's (word_spans) from the tokenizer, [UNK] for one it gives
    none. A ValueError for a context of no words."""
    ids, spans = [], []
    for start, end in word_spans(context):
        word = tokenizer.encode(context[start:end]) or [unknown]
        ids += word
        spans += [(start, end)] * len(word)
    if not ids:
        raise ValueError("empty context")
    return Pieces(ids, spans)


class QARow(NamedTuple):
    """A model row: [CLS] question [SEP] some of the context's pieces [SEP]."""
    ids: list[int]
    first: int  # the context's first piece in it
    firsts: list[int]  # the row position of each of its context pieces
    start: int  # the answer's first piece's position, 0 ([CLS]) when the row lacks the answer
    end: int  # its last piece's


def question_rows(question: Sequence[int], pieces: Sequence[int],
                  answer: Optional[tuple[int, int]], cls: int, sep: int, most: int,
                  stride: Optional[int] = None) -> list[QARow]:
    """A question's rows of at most `most` positions: the context's pieces in windows of the
    room the question leaves, each after the first starting `stride` pieces (default: half the
    room) before the end of the one before, until the last reaches the context's end; answer
    (its first and last piece, None: unanswerable or not known) at its positions in a row that
    holds all of it, else at [CLS]. A ValueError when the question leaves no room."""
    room = most - len(question) - 3
    if room < 1:
        raise ValueError(f"the question's {len(question)} pieces leave no room for the context "
                         f"in a row of {most} (a question may have {most - 4} at most)")
    overlap = room // 2 if stride is None else min(stride, room - 1)
    head = [cls, *question, sep]
    rows, start = [], 0
    while True:
        end = min(start + room, len(pieces))
        at, to = (0, 0)
        if answer is not None and start <= answer[0] and answer[1] < end:
            at, to = (len(head) + answer[0] - start, len(head) + answer[1] - start)
        rows.append(QARow([*head, *pieces[start:end], sep], start,
                          list(range(len(head), len(head) + end - start)), at, to))
        if end == len(pieces):
            return rows
        start = end - overlap


class Prediction(NamedTuple):
    text: str  # "" when no answer is given
    start: int  # the answer's characters [start, end) in the context; both -1 without one
    end: int
    score: float  # the best span's start + end logit (also when no answer is given)
    null_score: float  # [CLS]'s start + end logit, the least over the question's rows


def best_span(context: str, pieces: Pieces, rows: Sequence[QARow],
              logits: Sequence[np.ndarray], no_answer: bool, threshold: float = 0.0,
              max_answer: int = MAX_ANSWER) -> Prediction:
    """The answer in context (its pieces) from its question's rows and their logits (a row's
    (its length or more, 2): start, end), by the module docstring's rules; no_answer: whether
    it may be none."""
    reads = best_windows(rows, len(pieces.ids))  # each piece's row and position
    best = (float("-inf"), 0, 0)
    null = float("inf")
    for k, row in enumerate(rows):
        start, end = logits[k][:, 0], logits[k][:, 1]
        null = min(null, float(start[0] + end[0]))
        at = np.array(row.firsts)
        scores = start[at][:, None] + end[at][None, :]
        gap = np.arange(len(at))[None, :] - np.arange(len(at))[:, None]
        allowed = (gap >= 0) & (gap < max_answer)
        allowed &= np.array([reads[row.first + i] == (k, p)
                             for i, p in enumerate(row.firsts)])[:, None]
        scores = np.where(allowed, scores, -np.inf)
        flat = int(scores.argmax())
        score = float(scores.reshape(-1)[flat])
        if score > best[0]:
            best = (score, row.first + flat // len(at), row.first + flat % len(at))
    score, first, last = best
    if no_answer and null > score + threshold:
        return Prediction("", -1, -1, score, null)
    start, end = pieces.spans[first][0], pieces.spans[last][1]
    return Prediction(context[start:end], start, end, score, null)


def answer_lines(found: Prediction) -> list[str]:
    """What the answer commands print for a question's answer found."""
    if not found.text:
        return [f"no answer: [CLS] scores {found.null_score:.4f}, the best span "
                f"{found.score:.4f}"]
    return [f"answer [{found.start}, {found.end}): {found.text}",
            f"score {found.score:.4f} (start + end logit; [CLS] {found.null_score:.4f})"]
