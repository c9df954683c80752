"""Named-entity tagging (BERT fine-tuning, --task tag): CoNLL sentences (pygpt.data.conll) as
rows of the context, a loss per word (at its first piece); an evaluation reports the loss and
the word accuracy over whole passes of the validation rows, and, from the model's predictions
over whole sentences (each word read where its row gives it the most context), entity-level
precision, recall and F1 micro-averaged and F1 per entity type (pygpt_runtime.conll)."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from pygpt.data.common import IGNORE_INDEX, held_out
from pygpt.data.conll import EncodedTags, labels as tag_labels
from pygpt_runtime.conll import Sentence, read_conll
from pygpt.data.labelled import SPLIT_SEED, VAL_FRACTION
from pygpt.decoding.finite import require_finite
from pygpt.tasks import FineTuning
from pygpt_runtime.conll import EntityScore, score
from pygpt_runtime.tagging import overlap_for
from pygpt_runtime.windows import best_windows


@torch.inference_mode()
def predict_tags(model: torch.nn.Module, encoded: EncodedTags, labels: Sequence[str],
                 batch_size: int = 64) -> list[list[str]]:
    """The tags the model gives each word of every encoded sentence, in order: each word's from
    the row that reads it with the most context."""
    device = next(model.parameters()).device
    best: list[torch.Tensor] = []  # each row's predicted label id per position
    for batch in encoded.in_order(batch_size):
        batch = batch._replace(labels=None)
        inputs = {k: (v.to(device) if v is not None else None)
                  for k, v in batch._asdict().items()}
        best += list(require_finite(model(**inputs).logits).argmax(-1).cpu())
    by_sentence: dict[int, list[int]] = {}
    for r, n in enumerate(encoded.sentence_of):
        by_sentence.setdefault(n, []).append(r)
    tags = []
    for n in sorted(by_sentence):
        rows = [encoded.rows[r] for r in by_sentence[n]]
        n_words = rows[-1].first + len(rows[-1].firsts)
        tags.append([labels[int(best[by_sentence[n][r]][at])]
                     for r, at in best_windows(rows, n_words)])
    return tags


def entity_metrics(scores: dict[str, EntityScore]) -> dict[str, float]:
    """An evaluation's entity figures: micro precision, recall and F1, and each type's F1."""
    micro = scores["micro"]
    return {"precision": micro.precision, "recall": micro.recall, "f1": micro.f1,
            **{f"f1_{kind}": s.f1 for kind, s in scores.items() if kind != "micro"}}


class Tagging(FineTuning):
    """Tagged sentences (their tags `labels`: O, then each type's B- and I-) as rows, evaluated
    on all the validation rows (FineTuning). The loop sizes the model's head by `labels`
    and saves them with each checkpoint."""

    def __init__(self, train: EncodedTags, val: EncodedTags, val_sentences: list[Sentence],
                 labels: list[str], repaired: int):
        self.splits = {"train": train, "val": val}
        self.val_sentences = val_sentences
        self.labels = labels
        self.repaired = repaired

    @classmethod
    def from_files(cls, data: str, val_data: Optional[str], tokenizer, block_size: int,
                   labels: Optional[list[str]] = None) -> "Tagging":
        """From a CoNLL file (and a validation file, else a held-out tenth of its sentences).
        The tags are data's unless given (a resumed run's); the validation file's must be
        among them."""
        tagged = read_conll(data)
        train, repaired = tagged.sentences, tagged.repaired
        if val_data is None:
            train, val = held_out(train, VAL_FRACTION, SPLIT_SEED, data, "sentence")
        else:
            val_tagged = read_conll(val_data)
            val, repaired = val_tagged.sentences, repaired + val_tagged.repaired
        if labels is None:
            labels = tag_labels(train)
            if len(labels) < 3:
                raise ValueError(f"{data}: every word is tagged O; a tagger needs entities")
        overlap = overlap_for(block_size)
        return cls(EncodedTags(train, labels, tokenizer, block_size, overlap, data),
                   EncodedTags(val, labels, tokenizer, block_size, overlap, val_data or data),
                   val, labels, repaired)

    def summary(self):
        train, val = (len(self.splits[s]) for s in ("train", "val"))
        kinds = sorted({label[2:] for label in self.labels[1:]})
        repaired = (f"; {self.repaired:,} I- tags that began an entity read as B-"
                    if self.repaired else "")
        return (f"{train:,} training and {val:,} validation rows ({len(self.val_sentences):,} "
                f"validation sentences) of entity types {', '.join(kinds)}{repaired}")

    def metrics(self, output, batch):
        at = batch.labels != IGNORE_INDEX
        n = int(at.sum())
        correct = (output.logits.argmax(-1)[at] == batch.labels[at]).sum().item()
        loss = output.loss.item() * n if output.loss is not None else 0.0
        return {"loss": (loss, n), "acc": (correct, n)}

    def summarise(self, means):
        return means

    def model_metrics(self, model):
        predicted = predict_tags(model, self.splits["val"], self.labels)
        scores = score([s.tags for s in self.val_sentences], predicted)
        return {f"val_{name}": value for name, value in entity_metrics(scores).items()}

    def describe(self, record):
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(word acc {record['val_acc']:.3f}, entity F1 {record['val_f1']:.3f})")
