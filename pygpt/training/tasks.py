"""What a run trains for, per model family: where its batches come from and what an evaluation
reports. The loop asks a task for batches (NamedTuples whose fields are the model's forward
arguments, batch first, so that ranks can slice them) and for each batch's metrics, and never
looks inside either.

- LanguageModelling (GPT): random context windows, next-token loss; reports loss, perplexity
  and bits per character (comparable across tokenizers).
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple, Optional, Protocol

import torch

from pygpt.data import TokenFile, TokenSplits

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
