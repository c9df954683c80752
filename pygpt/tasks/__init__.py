"""What a run trains for, per model family: where its batches come from and what an evaluation
reports. The loop asks a task for batches (NamedTuples whose fields are the model's forward
arguments, batch first, so that ranks can slice them) and for each batch's metrics, and never
looks inside either.

- LanguageModelling (GPT): random context windows, next-token loss; reports loss, perplexity
  and bits per character (comparable across tokenizers).
- MaskedLanguageModelling (BERT): sentence pairs with masked tokens (pygpt.data.mlm); reports
  the total loss, the masked-LM loss and accuracy over the masked tokens, and next-sentence
  accuracy.
- Classification (BERT fine-tuning): labelled texts (pygpt.data.labelled); reports loss,
  accuracy and macro-F1, on the whole validation set every time.
- Tagging (BERT fine-tuning; pygpt.tasks.tagging): CoNLL sentences, a tag per word; reports
  loss and word accuracy, and from the model's tags over whole validation sentences
  entity-level precision, recall and F1 (micro, and F1 per type) in its `model_metrics`.
- QuestionAnswering (BERT fine-tuning; pygpt.tasks.qa): SQuAD questions, an answer span per
  question; reports loss and how often a row's start and end are both right, and from the
  model's answers over all of each question's windows SQuAD's exact match and F1.
- Translation (seq2seq; pygpt.tasks.seq2seq): sentence pairs in token-budget
  batches (`by_tokens`: ranks draw their own batches instead of slicing one by rows), and
  validation BLEU from its `model_metrics`.

Every task answers the same members (TaskDefaults gives the common answers), so the loop never
asks which task, or which family, it runs.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, NamedTuple, Optional, Protocol

import torch
import torch.nn.functional as F

from pygpt.data.text import TokenFile, TokenSplits
from pygpt.data.labelled import (Encoded, counts, held_out_split, labels_of, macro_f1,
                                  read_labelled)
from pygpt.data.common import IGNORE_INDEX
from pygpt.data.mlm import MLMBatches

Metrics = dict[str, tuple[float, float]]  # name -> (sum, count) over the batches evaluated


class TokenHead(NamedTuple):
    """A BERT head that reads each token rather than one vector a row."""
    what: str  # the model it makes, for messages
    task: str  # the --task that trains it
    command: str  # the module whose command runs it


# By the pooling that says so in the config: the heads no classifier command or server route
# reads (their outputs are per token); an ONNX export names their task in its runner.json.
TOKEN_HEADS = {"token": TokenHead("an entity tagger", "tag", "pygpt.tag"),
               "span": TokenHead("a question answerer", "qa", "pygpt.answer")}


class Task(Protocol):
    def batch(self, split: str, batch_size: int,
              generator: Optional[torch.Generator] = None) -> NamedTuple:
        """batch_size examples drawn from split ("train" or "val")."""

    def eval_batches(self, split: str, batch_size: int, generator: torch.Generator,
                     iters: int) -> Iterable[NamedTuple]:
        """The batches an evaluation of split runs on: `iters` draws from generator (which the
        evaluation seeds the same way every time), or a fixed pass over the split."""

    def tokens(self, batch: NamedTuple) -> int:
        """The real tokens a batch holds (for tokens/s)."""

    def metrics(self, output: Any, batch: NamedTuple) -> Metrics:
        """What the model's output on batch adds to the evaluation's sums."""

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        """The evaluation's means with any derived figures added."""

    def describe(self, record: dict[str, Any]) -> str:
        """One line on an evaluation record, for the progress output."""

    def summary(self) -> str:
        """What the run trains on, in a few words (its splits' sizes), printed at the start."""

    by_tokens: bool  # batches sized by a token budget: each rank draws its own, unsliced
    labels: Optional[list[str]]  # a classifier's classes (saved with the checkpoint), or None

    def model_metrics(self, model: Any) -> dict[str, Any]:
        """Figures of an evaluation that run the model beyond its loss (a translator's BLEU),
        on the bare model; {} for none."""

    def inputs(self, batch: NamedTuple) -> dict[str, Any]:
        """The keyword arguments of the model's forward for one of the task's batches (the
        batch's fields, and the loss settings the task trains with)."""


class TaskDefaults:
    """What most tasks answer: batches sliced by rows, no labels, no model metrics."""

    by_tokens = False
    labels: Optional[list[str]] = None

    def model_metrics(self, model: Any) -> dict[str, Any]:
        return {}

    def inputs(self, batch: NamedTuple) -> dict[str, Any]:
        return batch._asdict()


class _DrawnEvaluation(TaskDefaults):
    """Evaluates on `iters` random batches of each split."""

    def eval_batches(self, split, batch_size, generator, iters):
        return (self.batch(split, batch_size, generator) for _ in range(iters))


class LanguageModelling(_DrawnEvaluation):
    def __init__(self, token_file: TokenFile, block_size: int):
        self.splits = TokenSplits(token_file.tokens, block_size)
        self.chars_per_token = token_file.chars_per_token

    def batch(self, split, batch_size, generator=None):
        return self.splits.batch(split, batch_size, generator)

    def tokens(self, batch):
        return batch.idx.numel()

    def summary(self):
        train, val = (len(self.splits.splits[s]) for s in ("train", "val"))
        return f"{train:,} training and {val:,} validation tokens (the last tenth)"

    def metrics(self, output, batch):
        return {"loss": (output.loss.item(), 1)}  # the mean over batches of their mean loss

    def summarise(self, means):
        return {**means, "ppl": math.exp(means["loss"]),
                "bpc": means["loss"] / math.log(2) / self.chars_per_token}

    def describe(self, record):
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(ppl {record['val_ppl']:.2f}, {record['val_bpc']:.3f} bits/char)")


class MaskedLanguageModelling(_DrawnEvaluation):
    def __init__(self, batches: MLMBatches):
        self.batches = batches

    def batch(self, split, batch_size, generator=None):
        return self.batches.batch(split, batch_size, generator)

    def summary(self):
        train, val = (len(self.batches.splits[s]) for s in ("train", "val"))
        return f"{train:,} training and {val:,} validation lines (the last tenth)"

    def tokens(self, batch):
        return int(batch.lengths.sum())

    def training_rows(self) -> int:
        """How many rows one pass over the training set reads (what --epochs counts)."""
        return len(self.splits["train"])

    def metrics(self, output, batch):
        labels = batch.mlm_labels[batch.mlm_labels != IGNORE_INDEX]
        mlm_loss = F.cross_entropy(output.mlm_logits.float(), labels, reduction="sum").item()
        correct = (output.mlm_logits.argmax(-1) == labels).sum().item()
        result = {"loss": (output.loss.item(), 1), "mlm_loss": (mlm_loss, labels.numel()),
                  "mlm_acc": (correct, labels.numel())}
        if output.nsp_logits is not None:
            nsp_correct = (output.nsp_logits.argmax(-1) == batch.nsp_labels).sum().item()
            result["nsp_acc"] = (nsp_correct, batch.nsp_labels.numel())
        return result

    def summarise(self, means):
        return means

    def describe(self, record):
        nsp = f", next-sentence acc {record['val_nsp_acc']:.3f}" if "val_nsp_acc" in record else ""
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(masked-LM {record['val_mlm_loss']:.4f}, acc {record['val_mlm_acc']:.3f}{nsp})")


class FineTuning(_DrawnEvaluation):
    """What the fine-tuning tasks share: their encoded splits (`splits`: "train" and "val",
    each with draw and in_order), batches drawn at random for training; an evaluation passes
    over the whole validation set in order, and over eval_iters random batches of the training
    set."""

    splits: dict[str, Any]

    def batch(self, split, batch_size, generator=None):
        return self.splits[split].draw(batch_size, generator)

    def eval_batches(self, split, batch_size, generator, iters):
        if split == "val":
            return self.splits["val"].in_order(batch_size)
        return super().eval_batches(split, batch_size, generator, iters)

    def tokens(self, batch):
        return int(batch.lengths.sum())

    def training_rows(self) -> int:
        """How many rows one pass over the training set reads (what --epochs counts)."""
        return len(self.splits["train"])


class Classification(FineTuning):
    """Labelled examples (their classes `labels`, sorted), evaluated on the whole validation
    set (FineTuning). Accuracy and macro-F1 come from per-class counts summed over
    the evaluation, never from per-batch means. The loop sizes the model's head by `labels` and
    saves them with each checkpoint."""

    def __init__(self, train: Encoded, val: Encoded, labels: list[str]):
        self.splits = {"train": train, "val": val}
        self.labels = labels

    @classmethod
    def from_files(cls, data: str, val_data: Optional[str], tokenizer, block_size: int,
                   labels: Optional[list[str]] = None) -> "Classification":
        """From a labelled file (and a validation file, else a held-out tenth of data). The
        classes are data's labels unless given (a resumed run's); the validation file's must
        be among them."""
        train = read_labelled(data)
        if val_data is None:
            labels_of(train, data)  # two classes at least, before splitting
            train, val = held_out_split(train)
        else:
            val = read_labelled(val_data)
        if labels is None:
            labels = labels_of(train, data)
        return cls(Encoded(train, labels, tokenizer, block_size, data),
                   Encoded(val, labels, tokenizer, block_size, val_data or data), labels)

    def summary(self):
        train, val = (len(self.splits[s]) for s in ("train", "val"))
        shown = ", ".join(self.labels[:10]) + (", ..." if len(self.labels) > 10 else "")
        return (f"{train:,} training and {val:,} validation examples of {len(self.labels)} "
                f"labels: {shown}")

    def metrics(self, output, batch):
        n = batch.labels.numel()
        predicted = output.logits.argmax(-1)
        result = {"loss": (output.loss.item() * n, n),
                  "acc": ((predicted == batch.labels).sum().item(), n)}
        # Each count over the examples seen: their means keep the ratios F1 is made of.
        for kind, per_class in zip(("tp", "fp", "fn"),
                                   counts(predicted, batch.labels, len(self.labels))):
            result.update({f"{kind}{k}": (c, n) for k, c in enumerate(per_class.tolist())})
        return result

    def summarise(self, means):
        n = len(self.labels)
        f1 = macro_f1(*([means[f"{kind}{k}"] for k in range(n)] for kind in ("tp", "fp", "fn")))
        return {"loss": means["loss"], "acc": means["acc"], "f1": f1}

    def describe(self, record):
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(acc {record['val_acc']:.3f}, macro-F1 {record['val_f1']:.3f})")
