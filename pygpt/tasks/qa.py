"""Extractive question answering (BERT fine-tuning, --task qa): SQuAD questions (pygpt.data.squad)
as rows of [CLS] question [SEP] context-window [SEP], a start and an end logit per token (pooling
"span"); an evaluation reports the loss and how often a row's start and end are both right over
whole passes of the validation rows, and, from the model's answers over all of each question's
rows, SQuAD's exact match and F1 (pygpt.tasks.squad).

A question's answer is its best span over all its rows: start <= end, at most MAX_ANSWER pieces,
inside the context, starting at a piece read in the row that gives it the most context (as BERT's
run_squad), scored start logit + end logit. Where unanswerable questions are allowed (v2.0), no
answer is given when [CLS]'s score (its least over the rows) beats the best span's by more than
a threshold (0 by default, as the v2.0 baseline)."""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import torch

from pygpt.data.common import best_windows, held_out
from pygpt.data.labelled import SPLIT_SEED, VAL_FRACTION
from pygpt.data.squad import EncodedQA, Question, questions_of, read_squad
from pygpt.decoding.finite import require_finite
from pygpt.tasks import FineTuning
from pygpt.tasks.squad import squad_scores

SPAN_LABELS = ["start", "end"]  # the head's two outputs a token, saved as a QA model's labels
MAX_ANSWER = 30  # pieces of the longest answer predicted (run_squad's max_answer_length)


class Prediction(NamedTuple):
    text: str  # "" when no answer is given
    start: int  # the answer's characters [start, end) in the context; both -1 without one
    end: int
    score: float  # the best span's start + end logit (also when no answer is given)
    null_score: float  # [CLS]'s start + end logit, the least over the question's rows


@torch.inference_mode()
def row_logits(model: torch.nn.Module, encoded: EncodedQA,
               batch_size: int = 64) -> list[torch.Tensor]:
    """Each row's span logits (its length, 2), in float32 on the CPU."""
    device = next(model.parameters()).device
    found: list[torch.Tensor] = []
    for batch in encoded.in_order(batch_size):
        batch = batch._replace(labels=None)
        inputs = {k: (v.to(device) if v is not None else None)
                  for k, v in batch._asdict().items()}
        logits = require_finite(model(**inputs).logits).float().cpu()
        found += [row[:n] for row, n in zip(logits, batch.lengths.tolist())]
    return found


def best_answer(encoded: EncodedQA, question: int, rows: Sequence[int],
                logits: Sequence[torch.Tensor], no_answer: bool, threshold: float = 0.0,
                max_answer: int = MAX_ANSWER) -> Prediction:
    """The answer to encoded's question number `question` from its rows' logits (module
    docstring); no_answer: whether it may be none."""
    pieces = encoded.pieces[question]
    windows = [encoded.rows[r] for r in rows]
    reads = best_windows(windows, len(pieces.ids))  # each piece's row and position
    best = (float("-inf"), 0, 0)
    null = float("inf")
    for k, (row, r) in enumerate(zip(windows, rows)):
        start, end = logits[r][:, 0], logits[r][:, 1]
        null = min(null, float(start[0] + end[0]))
        at = torch.tensor(row.firsts)
        scores = start[at][:, None] + end[at][None, :]
        gap = torch.arange(len(at))[None, :] - torch.arange(len(at))[:, None]
        allowed = (gap >= 0) & (gap < max_answer)
        allowed &= torch.tensor([reads[row.first + i] == (k, p)
                                 for i, p in enumerate(row.firsts)])[:, None]
        scores = scores.masked_fill(~allowed, float("-inf"))
        flat = int(scores.argmax())
        score = float(scores.view(-1)[flat])
        if score > best[0]:
            best = (score, row.first + flat // len(at), row.first + flat % len(at))
    score, first, last = best
    if no_answer and null > score + threshold:
        return Prediction("", -1, -1, score, null)
    start, end = pieces.spans[first][0], pieces.spans[last][1]
    return Prediction(encoded.questions[question].context[start:end], start, end, score, null)


def predict_answers(model: torch.nn.Module, encoded: EncodedQA, no_answer: bool,
                    threshold: float = 0.0, batch_size: int = 64) -> list[Prediction]:
    """The model's answer to every encoded question, in order."""
    logits = row_logits(model, encoded, batch_size)
    rows: dict[int, list[int]] = {}
    for r, n in enumerate(encoded.question_of):
        rows.setdefault(n, []).append(r)
    return [best_answer(encoded, n, rows[n], logits, no_answer, threshold)
            for n in range(len(encoded.questions))]


def answers_scored(questions: Sequence[Question],
                   predictions: Sequence[Prediction]) -> dict[str, float]:
    """SQuAD's scores (pygpt.tasks.squad) of predictions for questions."""
    return squad_scores([[a.text for a in q.answers] for q in questions],
                        [p.text for p in predictions])


def unanswerable(questions: Sequence[Question]) -> int:
    return sum(not q.answers for q in questions)


class QuestionAnswering(FineTuning):
    """SQuAD questions as rows, evaluated on all the validation rows (FineTuning). Its labels
    are SPAN_LABELS, which the loop sizes the head by and saves with each checkpoint. Answers
    may be none when the training or validation questions include unanswerable ones."""

    labels = SPAN_LABELS

    def __init__(self, train: EncodedQA, val: EncodedQA):
        self.splits = {"train": train, "val": val}
        self.no_answer = bool(unanswerable(train.questions) or unanswerable(val.questions))

    @classmethod
    def from_files(cls, data: str, val_data: Optional[str], tokenizer, block_size: int,
                   labels: Optional[list[str]] = None) -> "QuestionAnswering":
        """From a SQuAD file (and a validation file, else a held-out tenth of its paragraphs,
        each with all its questions). labels: a resumed run's, which must be SPAN_LABELS."""
        if labels is not None and list(labels) != SPAN_LABELS:
            raise ValueError(f"a question-answering model's labels are {SPAN_LABELS}, got "
                             f"{labels}")
        train = read_squad(data)
        if val_data is None:
            train, val = held_out(train, VAL_FRACTION, SPLIT_SEED, data, "paragraph")
        else:
            val = read_squad(val_data)
        return cls(EncodedQA(questions_of(train), tokenizer, block_size, data),
                   EncodedQA(questions_of(val), tokenizer, block_size, val_data or data))

    def summary(self):
        train, val = self.splits["train"], self.splits["val"]
        return (f"{len(train):,} training rows ({len(train.questions):,} questions, "
                f"{unanswerable(train.questions):,} unanswerable) and {len(val):,} validation "
                f"rows ({len(val.questions):,} questions, {unanswerable(val.questions):,} "
                "unanswerable)")

    def metrics(self, output, batch):
        n, length = batch.labels.shape[0], output.logits.shape[1]
        real = torch.arange(length, device=batch.lengths.device) < batch.lengths[:, None]
        # (B, 2): each row's likeliest start and end among its real tokens
        predicted = output.logits.masked_fill(~real[..., None], float("-inf")).argmax(1)
        correct = (predicted == batch.labels).all(1).sum().item()
        return {"loss": (output.loss.item() * n, n), "acc": (correct, n)}

    def summarise(self, means):
        return means

    def model_metrics(self, model):
        val = self.splits["val"]
        scores = answers_scored(val.questions, predict_answers(model, val, self.no_answer))
        return {f"val_{name}": value for name, value in scores.items()}

    def describe(self, record):
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(rows with start and end right {record['val_acc']:.3f}, exact match "
                f"{record['val_exact']:.3f}, F1 {record['val_f1']:.3f})")
