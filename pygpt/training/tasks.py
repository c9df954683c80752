"""What a run trains for, per model family: where its batches come from and what an evaluation
reports. The loop asks a task for batches (NamedTuples whose fields are the model's forward
arguments, batch first, so that ranks can slice them) and for each batch's metrics, and never
looks inside either.

- LanguageModelling (GPT): random context windows, next-token loss; reports loss, perplexity
  and bits per character (comparable across tokenizers).
- MaskedLanguageModelling (BERT): sentence pairs with masked tokens (pygpt.mlm_data); reports
  the total loss, the masked-LM loss and accuracy over the masked tokens, and next-sentence
  accuracy.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Protocol

import torch
import torch.nn.functional as F

from pygpt.data import TokenFile, TokenSplits
from pygpt.mlm_data import IGNORE_INDEX, MLMBatches

Metrics = dict[str, tuple[float, float]]  # name -> (sum, count) over the batches evaluated


class Task(Protocol):
    def batch(self, split: str, batch_size: int,
              generator: Optional[torch.Generator] = None) -> NamedTuple:
        """batch_size examples drawn from split ("train" or "val")."""

    def tokens(self, batch: NamedTuple) -> int:
        """The real tokens a batch holds (for tokens/s)."""

    def metrics(self, output: Any, batch: NamedTuple) -> Metrics:
        """What the model's output on batch adds to the evaluation's sums."""

    def summarise(self, means: dict[str, float]) -> dict[str, float]:
        """The evaluation's means with any derived figures added."""

    def describe(self, record: dict[str, Any]) -> str:
        """One line on an evaluation record, for the progress output."""


class LanguageModelling:
    def __init__(self, token_file: TokenFile, block_size: int):
        self.splits = TokenSplits(token_file.tokens, block_size)
        self.chars_per_token = token_file.chars_per_token

    def batch(self, split, batch_size, generator=None):
        return self.splits.batch(split, batch_size, generator)

    def tokens(self, batch):
        return batch.idx.numel()

    def metrics(self, output, batch):
        return {"loss": (output.loss.item(), 1)}  # the mean over batches of their mean loss

    def summarise(self, means):
        return {**means, "ppl": math.exp(means["loss"]),
                "bpc": means["loss"] / math.log(2) / self.chars_per_token}

    def describe(self, record):
        return (f"train loss {record['train_loss']:.4f}, val loss {record['val_loss']:.4f} "
                f"(ppl {record['val_ppl']:.2f}, {record['val_bpc']:.3f} bits/char)")


class MaskedLanguageModelling:
    def __init__(self, batches: MLMBatches):
        self.batches = batches

    def batch(self, split, batch_size, generator=None):
        return self.batches.batch(split, batch_size, generator)

    def tokens(self, batch):
        return int(batch.lengths.sum())

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
