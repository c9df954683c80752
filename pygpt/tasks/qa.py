"""Extractive question answering (BERT fine-tuning, --task qa): SQuAD questions (pygpt.data.squad)
as rows of [CLS] question [SEP] context-window [SEP], a start and an end logit per token (pooling
"span"); an evaluation reports the loss and how often a row's start and end are both right over
whole passes of the validation rows, and, from the model's answers over all of each question's
rows, SQuAD's exact match and F1 (pygpt_runtime.squad).

A question's answer is its best span over all its rows, as pygpt_runtime.answering finds it (the
runtime shares it): start <= end, at most MAX_ANSWER pieces, start logit + end logit, or none
where unanswerable questions are allowed and [CLS] scores better."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from pygpt.data.common import held_out
from pygpt.data.labelled import SPLIT_SEED, VAL_FRACTION
from pygpt.data.squad import EncodedQA
from pygpt.decoding.finite import require_finite
from pygpt.tasks import FineTuning
from pygpt_runtime.answering import MAX_ANSWER, Prediction, best_span
from pygpt_runtime.families import SPAN_LABELS
from pygpt_runtime.squad import answers_scored, questions_of, read_squad, unanswerable


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
    """The answer to encoded's question number `question` from its rows' logits
    (pygpt_runtime.answering.best_span); no_answer: whether it may be none."""
    return best_span(encoded.questions[question].context, encoded.pieces[question],
                     [encoded.rows[r] for r in rows], [logits[r].numpy() for r in rows],
                     no_answer, threshold, max_answer)


def predict_answers(model: torch.nn.Module, encoded: EncodedQA, no_answer: bool,
                    threshold: float = 0.0, batch_size: int = 64) -> list[Prediction]:
    """The model's answer to every encoded question, in order."""
    logits = row_logits(model, encoded, batch_size)
    rows: dict[int, list[int]] = {}
    for r, n in enumerate(encoded.question_of):
        rows.setdefault(n, []).append(r)
    return [best_answer(encoded, n, rows[n], logits, no_answer, threshold)
            for n in range(len(encoded.questions))]


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
